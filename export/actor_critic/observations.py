"""Raw observations for parity checks: sampled from the space, plus any the user gives.

A ``--parity-observations`` file is a ``.npy`` array (a batch of observations) or an ``.npz``
archive: for a Dict space one array per key, otherwise a single array. Its observations are
validated against the space like a request would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from export.actor_critic.source import Observations
from export.errors import ExportError
from export.files import require_file
from kernel.errors import InvalidInput
from kernel.spaces import Dict, Discrete, Leaf, MultiDiscrete, leaves, parse_observations, sample

_EXPECTED = "a .npy array of raw observations, or an .npz with one array per Dict key"


def sampled(space: Leaf | Dict, count: int, seed: int) -> Observations:
    rng = np.random.default_rng(seed)
    return {key: sample(leaf, rng, count) for key, leaf in leaves(space)}


def sampled_masks(action_space: Leaf, count: int, seed: int) -> np.ndarray:
    """Random action masks (bool [count, n]) leaving at least one legal action per row, in
    each dimension of a MultiDiscrete space; the first row allows every action."""
    parts = (
        list(action_space.nvec)
        if isinstance(action_space, MultiDiscrete)
        else [action_space.n if isinstance(action_space, Discrete) else 1]
    )
    rng = np.random.default_rng(seed + 1)
    masks = []
    for size in parts:
        part = rng.random((count, size)) < 0.6
        part[np.arange(count), rng.integers(0, size, count)] = True
        masks.append(part)
    joined = np.concatenate(masks, axis=1)
    joined[0] = True
    return joined


def from_file(space: Leaf | Dict, path: Path) -> Observations:
    require_file(path, "--parity-observations", _EXPECTED)
    value = _read(path, space)
    try:
        return parse_observations(space, value, field=f"--parity-observations {path}").arrays
    except InvalidInput as exc:
        raise ExportError(exc.message) from None


def joined(first: Observations, second: Observations) -> Observations:
    return {key: np.concatenate([first[key], second[key]]) for key in first}


def count(observations: Observations) -> int:
    return len(next(iter(observations.values())))


def request_form(observations: Observations, row: int) -> Any:
    """One observation as a one-element batch in request JSON form (lists, or a key mapping)."""
    if None in observations:
        return observations[None][row : row + 1].tolist()
    return {str(key): array[row : row + 1].tolist() for key, array in observations.items()}


def _read(path: Path, space: Leaf | Dict) -> Any:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ExportError(
            f"--parity-observations {path}: unreadable ({exc}); give {_EXPECTED}"
        ) from None
    if isinstance(loaded, np.ndarray):
        return loaded
    with loaded:
        arrays = {name: loaded[name] for name in loaded.files}
    if isinstance(space, Dict):
        return arrays
    if len(arrays) != 1:
        raise ExportError(
            f"--parity-observations {path}: holds arrays {sorted(arrays)}; for a space that "
            "is not a Dict give exactly one array"
        )
    return next(iter(arrays.values()))
