"""Reading a VecNormalize statistics pickle (``VecNormalize.save``) without an environment.

Unpickling runs code from the file: only give statistics files you trust.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from export.actor_critic.normalization import LeafStats, NormStats
from export.files import require_file
from serve.errors import ExportError

_EXPECTED = "the .pkl written by VecNormalize.save()"


def load(path: Path) -> Any:
    """The unpickled VecNormalize (its ``venv`` is None; normalize_obs works without one)."""
    from stable_baselines3.common.vec_env import VecNormalize

    require_file(path, "--vecnormalize", _EXPECTED)
    try:
        with path.open("rb") as f:
            loaded = pickle.load(f)
    except Exception as exc:  # pickle raises anything the file's code raises
        raise ExportError(
            f"--vecnormalize {path}: not a readable pickle ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:160]}); give {_EXPECTED}"
        ) from None
    if not isinstance(loaded, VecNormalize):
        raise ExportError(
            f"--vecnormalize {path}: holds a {type(loaded).__name__}, not a VecNormalize; "
            f"give {_EXPECTED}"
        )
    return loaded


def stats(vecnormalize: Any) -> NormStats | None:
    """The observation statistics to bake in; None when it did not normalise observations."""
    if not vecnormalize.norm_obs:
        return None
    rms = vecnormalize.obs_rms
    per_key = rms if isinstance(rms, dict) else {None: rms}
    return NormStats(
        leaves={key: _leaf(r) for key, r in per_key.items()},
        clip=float(vecnormalize.clip_obs),
        epsilon=float(vecnormalize.epsilon),
    )


def _leaf(rms: Any) -> LeafStats:
    return LeafStats(
        mean=np.asarray(rms.mean, dtype=np.float64), var=np.asarray(rms.var, dtype=np.float64)
    )
