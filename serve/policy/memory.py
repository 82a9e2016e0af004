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

Or the server holds it (``serve.batching.sequences``): the request names its sequences
instead, with the parameters Triton's sequence batcher reads:

- ``sequence_id``: an id (``kernel.identifiers``: a string of 1 to 128 characters, or an
  integer >= 0), one per observation (a list, distinct ids, for a batch);
- ``sequence_start``, ``sequence_end``: booleans as ``episode_start`` takes them; the first
  step of an episode starts its sequence, the last ends it;
- ``sequence_owner``: optional, a key of the client's own (a string of 1 to 128
  characters): its sequences are held under it, stepped and ended only by calls giving it.

``state`` and ``episode_start`` are then left out: the held memory feeds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernel.errors import InvalidInput
from kernel.identifiers import MAX_CHARACTERS, identifier
from kernel.json_shown import json_shown
from kernel.memory import Memory
from serve.dataplane.messages import SequenceStep

STATE = "state"
EPISODE_START = "episode_start"
SEQUENCE_ID = "sequence_id"
SEQUENCE_START = "sequence_start"
SEQUENCE_END = "sequence_end"
SEQUENCE_OWNER = "sequence_owner"
SEQUENCE_PARAMETERS = (SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END, SEQUENCE_OWNER)


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

    def held(self, parameters: Mapping[str, Any], rows: int, *, single: bool) -> SequenceStep:
        """A step of sequences the server holds the memory of."""
        if SEQUENCE_ID not in parameters:
            raise InvalidInput(
                f"{SEQUENCE_ID}: required with {SEQUENCE_START} or {SEQUENCE_END} (and "
                f"{SEQUENCE_OWNER}): name the sequence (the episode) this step belongs to"
            )
        return SequenceStep(
            ids=_sequence_ids(parameters[SEQUENCE_ID], rows, single=single),
            starts=_flags(SEQUENCE_START, parameters.get(SEQUENCE_START), rows, single=single),
            ends=_flags(SEQUENCE_END, parameters.get(SEQUENCE_END), rows, single=single),
            state_input=self.state_input,
            start_input=self.start_input,
            state_size=self.size,
            owner=_owner(parameters.get(SEQUENCE_OWNER)),
        )

    def feeds(self, memory: Memory) -> dict[str, np.ndarray]:
        return {self.state_input: memory.state, self.start_input: memory.episode_start}

    def _starts(self, value: Any, rows: int, *, single: bool) -> np.ndarray:
        return _flags(EPISODE_START, value, rows, single=single)

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


def _flags(name: str, value: Any, rows: int, *, single: bool) -> np.ndarray:
    """One boolean per row (``0``/``1`` too), or one for every row; False when left out."""
    if value is None:
        return np.zeros(rows, bool)
    try:
        flags = np.asarray(value)
    except ValueError:  # ragged lists
        flags = np.empty(0, object)
    if flags.dtype.kind in "iu" and np.isin(flags, (0, 1)).all():
        flags = flags.astype(bool)
    if flags.dtype == np.bool_ and flags.ndim == 0:
        return np.full(rows, bool(flags))
    if flags.dtype != np.bool_ or flags.shape != (rows,):
        every = "true or false" if single else f"true, false (every row) or {rows} booleans"
        raise InvalidInput(f"{name}: expected {every}, one per observation")
    return flags


def _owner(value: Any) -> str | None:
    """A ``sequence_owner`` key (None: the call gives none). Never echoed: it is a secret
    of its client's."""
    if value is None or (isinstance(value, str) and 0 < len(value) <= MAX_CHARACTERS):
        return value
    given = f"a string of {len(value)} characters" if isinstance(value, str) else "not a string"
    raise InvalidInput(
        f"{SEQUENCE_OWNER}: expected a key of the client's own, a string of 1 to "
        f"{MAX_CHARACTERS} characters; got {given}"
    )


def _sequence_ids(value: Any, rows: int, *, single: bool) -> tuple[str | int, ...]:
    if single or (rows == 1 and not isinstance(value, list)):
        return (identifier(value, SEQUENCE_ID, "a sequence id"),)
    if not isinstance(value, list) or len(value) != rows:
        raise InvalidInput(
            f"{SEQUENCE_ID}: expected a list of {rows} ids, one per observation; got "
            f"{json_shown(value)}"
        )
    ids = tuple(identifier(one, SEQUENCE_ID, "a sequence id") for one in value)
    if len(set(ids)) != rows:
        raise InvalidInput(
            f"{SEQUENCE_ID}: ids repeat within the request; each observation of a batch "
            "steps its own sequence"
        )
    return ids
