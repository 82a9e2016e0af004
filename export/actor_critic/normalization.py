"""Observation normalisation statistics, as VecNormalize and NormalizeObservation apply them.

``clip((obs - mean) / sqrt(var + epsilon), -clip, clip)``, per observation leaf, computed in
float64 and returned as float32 (what Stable-Baselines3's VecNormalize does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from export.errors import ExportError
from kernel.spaces import Dict, Leaf, leaf_shape, leaves


@dataclass(frozen=True)
class LeafStats:
    mean: np.ndarray  # float64, the leaf's shape in the raw (environment) layout
    var: np.ndarray


@dataclass(frozen=True)
class NormStats:
    """Statistics for the normalised leaves (key None: a space that is not a Dict)."""

    leaves: dict[str | None, LeafStats]
    clip: float | None
    epsilon: float

    def apply(self, key: str | None, obs: np.ndarray) -> np.ndarray:
        """The reference computation, in numpy, for one leaf of a batch of raw observations."""
        stats = self.leaves[key]
        scaled = (obs.astype(np.float64) - stats.mean) / np.sqrt(stats.var + self.epsilon)
        if self.clip is not None:
            scaled = np.clip(scaled, -self.clip, self.clip)
        return scaled.astype(np.float32)

    def check_fits(self, space: Leaf | Dict, origin: str) -> None:
        """Refuse statistics whose keys or shapes do not match the raw observation space."""
        shapes = {key: leaf_shape(leaf) for key, leaf in leaves(space)}
        for key, stats in self.leaves.items():
            if key not in shapes:
                raise ExportError(
                    f"{origin}: normalises observation key {key!r}, which the observation "
                    f"space does not have (keys: {sorted(map(str, shapes))})"
                )
            if stats.mean.shape != shapes[key] or stats.var.shape != shapes[key]:
                raise ExportError(
                    f"{origin}: statistics for {_name(key)} have shape {stats.mean.shape}, but "
                    f"the observation space's is {shapes[key]}; give the statistics saved "
                    "with this model"
                )


def _name(key: str | None) -> str:
    return "the observation" if key is None else f"key {key!r}"
