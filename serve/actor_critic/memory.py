"""A recurrent policy's memory in a request: ``state`` and ``episode_start``, checked.

The client holds the memory: each answer of a recurrent policy (RecurrentPPO) carries the
``state`` after its step, and the client sends it back with the next observation of the
same episode. ``state`` is one row of the contract's ``state.size`` floats per observation
(its layout, the LSTMs' hidden and cell states, is in the contract); ``episode_start``
says which observations begin an episode, whose memory the graph then resets to zeros,
as the source does.

- ``episode_start``: a boolean per observation (``0``/``1`` too), or one boolean for every
  row; left out, no row starts an episode.
- ``state``: required unless every row starts an episode (it is then zeros), as a float
  row (one observation) or one row per observation; finite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from serve.errors import InvalidInput

STATE = "state"
EPISODE_START = "episode_start"
FIELDS = (STATE, EPISODE_START)


@dataclass(frozen=True)
class Memory:
    """A request's memory, as the graph takes it."""

    state: np.ndarray  # float32 [rows, size]
    episode_start: np.ndarray  # bool [rows]


class MemoryInputs:
    def __init__(self, state_input: str, start_input: str, size: int) -> None:
        self.state_input = state_input  # the graph inputs the memory feeds
        self.start_input = start_input
        self.size = size

    def __call__(self, state: Any, episode_start: Any, rows: int, *, single: bool) -> Memory:
        starts = self._starts(episode_start, rows, single=single)
        if state is None:
            if not starts.all():
                raise InvalidInput(
                    f"{STATE}: required: this policy is recurrent; send the {STATE!r} the "
                    f"previous answer of the episode returned ({self._expected(rows, single)}),"
                    f" or {EPISODE_START}: true to begin an episode (its state starts at zeros)"
                )
            return Memory(np.zeros((rows, self.size), np.float32), starts)
        return Memory(self._state(state, rows, single=single), starts)

    def feeds(self, memory: Memory) -> dict[str, np.ndarray]:
        return {self.state_input: memory.state, self.start_input: memory.episode_start}

    def _starts(self, value: Any, rows: int, *, single: bool) -> np.ndarray:
        if value is None:
            return np.zeros(rows, bool)
        try:
            starts = np.asarray(value)
        except ValueError:  # ragged lists
            starts = np.empty(0, object)
        if starts.dtype.kind in "iu" and np.isin(starts, (0, 1)).all():
            starts = starts.astype(bool)
        if starts.dtype == np.bool_ and starts.ndim == 0:
            return np.full(rows, bool(starts))
        if starts.dtype != np.bool_ or starts.shape != (rows,):
            every = "true or false" if single else f"true, false (every row) or {rows} booleans"
            raise InvalidInput(
                f"{EPISODE_START}: expected {every}, one per observation: true where it "
                "begins an episode"
            )
        return starts

    def _state(self, value: Any, rows: int, *, single: bool) -> np.ndarray:
        try:
            given = np.asarray(value)
        except ValueError:  # ragged lists
            given = np.empty(0, object)
        if given.dtype.kind not in "fiu":
            raise InvalidInput(
                f"{STATE}: expected numbers; send {self._expected(rows, single)}, as the "
                "previous answer returned it"
            )
        shaped = (self.size,) if single else (rows, self.size)
        if given.shape != shaped:
            raise InvalidInput(
                f"{STATE}: shape {list(given.shape)}; send {self._expected(rows, single)}, as "
                "the previous answer returned it"
            )
        state = given.astype(np.float32, copy=False).reshape(rows, self.size)
        if not np.isfinite(state).all():
            row = int(np.argmax(~np.isfinite(state).all(axis=1)))
            raise InvalidInput(f"{STATE}[{row}]: holds a value that is not finite (NaN or inf)")
        return state

    def _expected(self, rows: int, single: bool) -> str:
        row = f"{self.size} floats"
        return f"one row of {row}" if single else f"one row of {row} per observation ({rows})"
