"""gymnasium NormalizeObservation statistics, saved by the user as an ``.npz``.

CleanRL never saves them; save them yourself after training, e.g.::

    rms = envs.envs[0].get_wrapper_attr("obs_rms")
    np.savez("obs_norm.npz", mean=rms.mean, var=rms.var, clip=10.0)

Arrays: ``mean`` and ``var`` (the observation's shape), optional scalars ``clip`` (CleanRL
clips normalised observations to 10) and ``epsilon`` (default 1e-8, gymnasium's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from export.actor_critic.normalization import LeafStats, NormStats
from export.errors import ExportError
from export.files import require_file

DEFAULT_EPSILON = 1e-8
_EXPECTED = "an .npz with arrays mean and var (and optionally clip, epsilon)"


def load(path: Path) -> NormStats:
    require_file(path, "--obs-norm", _EXPECTED)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: np.asarray(archive[name]) for name in archive.files}
    except Exception as exc:  # not a zip, pickled content, truncated file
        raise ExportError(f"--obs-norm {path}: unreadable ({exc}); give {_EXPECTED}") from None
    missing = sorted({"mean", "var"} - set(arrays))
    if missing:
        raise ExportError(f"--obs-norm {path}: has no {missing}; give {_EXPECTED}")
    return NormStats(
        leaves={
            None: LeafStats(arrays["mean"].astype(np.float64), arrays["var"].astype(np.float64))
        },
        clip=_scalar(arrays, "clip", path),
        epsilon=_scalar(arrays, "epsilon", path) or DEFAULT_EPSILON,
    )


def _scalar(arrays: dict[str, np.ndarray], name: str, path: Path) -> float | None:
    """The named scalar, None when absent; zero is refused (neither clip nor epsilon can be)."""
    if name not in arrays:
        return None
    value = arrays[name]
    if value.size != 1 or not np.isfinite(value).all() or not value.reshape(()) > 0:
        raise ExportError(
            f"--obs-norm {path}: {name} must be one finite number > 0, got {value!r:.60}"
        )
    return float(value.reshape(()))
