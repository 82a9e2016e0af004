"""Server-held memory of recurrent policies: a model's table of live sequences.

Triton's sequence batcher, for episodes. A client names its episode with a ``sequence_id``
and marks its first step ``sequence_start`` and its last ``sequence_end``; it sends
observations only. The table holds what each live sequence needs between steps: the
state its last step returned and the version that started it. Rows of different sequences
still share batches: a step is an ordinary request of the dynamic batcher, its ``state``
and ``episode_start`` feeds filled from here (:meth:`SequenceTable.begin`) and its next
state written back from the answer (:meth:`SequenceTable.commit`).

Rules, in order, for each row of a step:

1. a ``sequence_start`` row (re)starts its sequence: its state is zeros, and it runs on
   the route's version (the active one, unless the call names a version), which it keeps
   until it ends;
2. any other row continues a live sequence: an id never started, ended, or evicted is
   refused (422, saying which and how to start again);
3. a sequence has one step at a time: a row whose sequence has a step in flight is
   refused (409), as its state is not known until that step answers;
4. the rows of one call run on one version: continuing sequences pinned to different
   versions are refused (409); rows that start take the continuing rows' version;
5. a sequence idle for longer than ``idle_timeout_s`` is evicted when next seen or when
   room is needed; a full table evicts its least recently used idle sequence for a new
   one, and answers 429 when every sequence has a step in flight;
6. a step that fails (deadline, error) leaves its sequences as they were
   (:meth:`SequenceTable.abort`): the client may send it again; one that started a
   sequence leaves no sequence behind.

A sequence moves between two states, :class:`Phase` ``IDLE`` and ``STEPPING``; an ended
or evicted one leaves the table (evicted ids are remembered, boundedly, to say so).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum

import numpy as np

from serve.dataplane.messages import SequenceStep
from serve.errors import Conflict, InvalidInput, QueueFull
from serve.json_shown import json_shown

SequenceId = str | int


class Phase(Enum):
    IDLE = "idle"  # its state is the last step's: ready for the next step
    STEPPING = "stepping"  # a step is in flight; its state is being computed


@dataclass(slots=True)
class _Sequence:
    version: int | None  # None: its first step has not answered yet (and fixes it)
    state: np.ndarray  # float32 [size]: what the last step returned
    phase: Phase
    last_used: float  # monotonic seconds


@dataclass(frozen=True, slots=True)
class Held:
    """What a step runs with: the rows' states and the version the sequences are on."""

    state: np.ndarray  # float32 [rows, size]
    version: int | None  # None: every row starts; the route's version runs it


class SequenceTable:
    def __init__(self, model: str, capacity: int, idle_timeout_s: float) -> None:
        self.model = model
        self.capacity = capacity
        self.idle_timeout_s = idle_timeout_s
        self._live: OrderedDict[SequenceId, _Sequence] = OrderedDict()  # least recent first
        self._evicted: OrderedDict[SequenceId, str] = OrderedDict()  # id -> why, bounded
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._live)

    def versions(self) -> set[int]:
        """Versions live sequences are pinned to: an update keeps them loaded."""
        return {s.version for s in self._live.values() if s.version is not None}

    # ------------------------------------------------------------------ steps

    def begin(self, step: SequenceStep, size: int, now: float | None = None) -> Held:
        """The rows' states and version; every row's sequence is STEPPING until
        :meth:`commit` or :meth:`abort`. Raises (and changes nothing) when a rule refuses."""
        now = time.monotonic() if now is None else now
        continuing = [
            self._continuing(sequence_id, now)
            for sequence_id, start in zip(step.ids, step.starts, strict=True)
            if not start
        ]
        version = self._one_version(continuing)
        for sequence_id in step.ids:
            live = self._live.get(sequence_id)
            if live is not None and live.phase is Phase.STEPPING:
                raise _in_flight(sequence_id)
        rows = list(zip(step.ids, step.starts, strict=True))
        new = sum(1 for i, start in rows if start and i not in self._live)
        self._make_room(new, set(step.ids), now)
        state = np.zeros((len(step.ids), size), np.float32)
        for row, (sequence_id, start) in enumerate(rows):
            if start:
                self._live[sequence_id] = _Sequence(version, state[row], Phase.STEPPING, now)
                self._evicted.pop(sequence_id, None)
            else:
                live = self._live[sequence_id]
                state[row] = live.state
                live.phase = Phase.STEPPING
            self._live.move_to_end(sequence_id)
        return Held(state, version)

    def commit(
        self, step: SequenceStep, next_state: np.ndarray, version: int, now: float | None = None
    ) -> None:
        """The step answered: each sequence keeps its next state (ended ones leave)."""
        now = time.monotonic() if now is None else now
        for row, (sequence_id, end) in enumerate(zip(step.ids, step.ends, strict=True)):
            if end:
                self._live.pop(sequence_id, None)
                continue
            live = self._live.get(sequence_id)
            if live is None:
                continue
            live.state = np.array(next_state[row], np.float32)
            live.version, live.phase, live.last_used = version, Phase.IDLE, now

    def abort(self, step: SequenceStep, now: float | None = None) -> None:
        """The step failed: its sequences are as before it (a start leaves none)."""
        now = time.monotonic() if now is None else now
        for sequence_id, start in zip(step.ids, step.starts, strict=True):
            if start:
                self._live.pop(sequence_id, None)
                continue
            live = self._live.get(sequence_id)
            if live is not None:
                live.phase, live.last_used = Phase.IDLE, now

    def describe(self) -> dict[str, object]:
        stepping = sum(1 for s in self._live.values() if s.phase is Phase.STEPPING)
        return {
            "held": len(self._live),
            "stepping": stepping,
            "capacity": self.capacity,
            "idle_timeout_s": self.idle_timeout_s,
            "evictions": self.evictions,
        }

    # ------------------------------------------------------------------ rules

    def _continuing(self, sequence_id: SequenceId, now: float) -> _Sequence:
        live = self._live.get(sequence_id)
        if live is not None and live.phase is Phase.IDLE and self._idle_too_long(live, now):
            self._evict(sequence_id, f"it was idle for more than {self.idle_timeout_s:g} s")
            live = None
        if live is None:
            why = self._evicted.get(sequence_id)
            shown = json_shown(sequence_id)
            if why is not None:
                raise InvalidInput(
                    f"sequence_id {shown}: evicted ({why}); its state is gone: start the "
                    "episode again with sequence_start: true"
                )
            raise InvalidInput(
                f"sequence_id {shown}: no such live sequence of model {self.model!r} (never "
                "started, or ended); send its first step with sequence_start: true"
            )
        if live.phase is Phase.STEPPING:
            raise _in_flight(sequence_id)
        return live

    def _one_version(self, continuing: list[_Sequence]) -> int | None:
        versions = sorted({live.version for live in continuing if live.version is not None})
        if len(versions) > 1:
            raise Conflict(
                f"sequences of this call run on versions {versions}: each keeps the version "
                "it started with; send their steps in separate calls"
            )
        return versions[0] if versions else None

    def _make_room(self, new: int, stepping: set[SequenceId], now: float) -> None:
        """Room for ``new`` sequences, evicting idle ones not in this step (``stepping``)."""
        for sequence_id, live in list(self._live.items()):
            if len(self._live) + new <= self.capacity:
                return
            if live.phase is Phase.IDLE and sequence_id not in stepping:
                reason = (
                    f"it was idle for more than {self.idle_timeout_s:g} s"
                    if self._idle_too_long(live, now)
                    else f"the table of {self.capacity} sequences was full and it was the "
                    "least recently used"
                )
                self._evict(sequence_id, reason)
        if len(self._live) + new > self.capacity:
            raise QueueFull(
                f"model {self.model!r} holds {len(self._live)} sequences, each with a step in "
                f"flight (max_held_sequences {self.capacity}); retry shortly"
            )

    def _idle_too_long(self, live: _Sequence, now: float) -> bool:
        return now - live.last_used > self.idle_timeout_s

    def _evict(self, sequence_id: SequenceId, why: str) -> None:
        del self._live[sequence_id]
        self._evicted[sequence_id] = why
        self.evictions += 1
        while len(self._evicted) > self.capacity:
            self._evicted.popitem(last=False)


def _in_flight(sequence_id: SequenceId) -> Conflict:
    return Conflict(
        f"sequence_id {json_shown(sequence_id)}: a step of this sequence is in flight; send "
        "the next step once it has answered (its state comes from that answer)"
    )
