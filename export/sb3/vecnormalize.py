"""Reading a VecNormalize statistics pickle (``VecNormalize.save``) without an environment.

The file is a pickle of the whole wrapper. It is read by :mod:`export.sb3.pickles`, which
refuses anything but what VecNormalize's statistics need, unless ``trust_checkpoint`` lets
plain unpickling (which runs whatever the file names) read it. Files larger than any
statistics file are refused before they are read.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from export.actor_critic.normalization import LeafStats, NormStats
from export.errors import ExportError
from export.files import require_file
from export.sb3 import pickles

_EXPECTED = "the .pkl written by VecNormalize.save()"
MAX_BYTES = 256 << 20  # statistics of an 84x84x4 image space take about 0.5 MB


def load(path: Path, *, trust_checkpoint: bool) -> Any:
    """The unpickled VecNormalize (its ``venv`` is None; normalize_obs works without one)."""
    from stable_baselines3.common.vec_env import VecNormalize

    require_file(path, "--vecnormalize", _EXPECTED)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ExportError(
            f"--vecnormalize {path}: {size:,} bytes is far more than VecNormalize statistics "
            f"take (at most {MAX_BYTES:,} are read); give {_EXPECTED}"
        )
    try:
        blob = path.read_bytes()
        loaded = pickle.loads(blob) if trust_checkpoint else pickles.loads(blob)
    except pickles.UntrustedPickle as refused:
        raise ExportError(
            f"--vecnormalize {path}: the pickle names {refused.name}, which VecNormalize "
            "statistics do not need; unpickling it could run any code, so it was not "
            "unpickled and nothing in it ran. If you trust this file (you or your team saved "
            "it), pass --trust-checkpoint to unpickle it as it is"
        ) from None
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
