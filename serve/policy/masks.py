"""Action masks of a policy that takes them (MaskablePPO): checked like observations.

A mask is one row of booleans per observation, ``True`` where the action is legal: ``n``
for a Discrete action space, ``sum(nvec)`` for a MultiDiscrete one (each dimension's
actions side by side). Every row must leave at least one legal action (in every dimension):
the graph sets the logits of illegal actions to -1e8, so they are never chosen nor sampled,
and a row with none legal would have no action to take. ``0``/``1`` stand for
``false``/``true``, as the masks environments return often are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernel.errors import InvalidInput
from kernel.spaces import Dict, Discrete, Leaf, MultiDiscrete

FIELD = "action_masks"


class ActionMasks:
    def __init__(self, name: str, action_space: Leaf | Dict, width: int | str) -> None:
        self.name = name  # the graph input the masks feed
        self.width = int(width)  # the contract's shape [batch, width]
        if isinstance(action_space, MultiDiscrete):
            self._parts = list(action_space.nvec)
        elif isinstance(action_space, Discrete):
            self._parts = [action_space.n]
        else:
            self._parts = [self.width]

    def __call__(self, value: Any, rows: int, *, single: bool) -> np.ndarray:
        """The masks of a request's ``rows`` observations, as a bool array [rows, width]."""
        if value is None:
            raise InvalidInput(
                f"{FIELD}: required: this policy acts under an action mask; give "
                f"{self._expected(rows, single=single)}"
            )
        try:
            masks = np.asarray(value)
        except ValueError:  # ragged lists
            masks = np.empty(0)
        if masks.dtype != np.bool_:
            if masks.dtype.kind not in "iu" or not np.isin(masks, (0, 1)).all():
                raise InvalidInput(
                    f"{FIELD}: expected booleans (or 0 and 1); give "
                    f"{self._expected(rows, single=single)}"
                )
            masks = masks.astype(bool)
        shaped = (self.width,) if single else (rows, self.width)
        if masks.shape != shaped:
            raise InvalidInput(
                f"{FIELD}: shape {list(masks.shape)}; give {self._expected(rows, single=single)}"
            )
        masks = masks.reshape(rows, self.width)
        self._check_legal(masks)
        return masks

    def _check_legal(self, masks: np.ndarray) -> None:
        start = 0
        for dimension, size in enumerate(self._parts):
            none = ~masks[:, start : start + size].any(axis=1)
            if none.any():
                row = int(np.argmax(none))
                where = f" in action dimension {dimension}" if len(self._parts) > 1 else ""
                raise InvalidInput(
                    f"{FIELD}[{row}]: no legal action{where}; every mask needs at least one "
                    "true value (an observation with no legal action has nothing to act on)"
                )
            start += size

    def _expected(self, rows: int, *, single: bool) -> str:
        one = f"{self.width} booleans"
        if single:
            return f"one mask of {one}"
        return f"one mask of {one} per observation ({rows} masks)"
