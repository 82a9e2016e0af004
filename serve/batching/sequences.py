"""Server-held memory of recurrent policies: a model's table of live sequences.

Triton's sequence batcher, for episodes. A client names its episode with a ``sequence_id``
and marks its first step ``sequence_start`` and its last ``sequence_end``; it sends
observations only. It may also give a ``sequence_owner``: a key of its own (one only it
knows) its sequences are held under, apart from every other key's and from those started
without one. The table holds what each live sequence needs between steps: the
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
   room is needed; a new sequence that finds its owner at ``per_owner`` sequences, or the
   table full, evicts its own owner's least recently used idle sequence (a full table
   first evicts anyone's idle past the timeout), never another owner's live one, and is
   answered 429 when none can go;
6. a step that fails (deadline, error) leaves its sequences as they were
   (:meth:`SequenceTable.abort`): the client may send it again; one that started a
   sequence leaves no sequence behind;
7. a sequence is its owner's: held under its ``sequence_owner`` (the sequences started
   without one are held together, as one owner's), it is stepped, ended and restarted only
   by calls giving the same key. Another key's call naming its id finds no such sequence
   (rule 2's answer, as for an id never started) and starts one of its own under that id.

A sequence moves between two states, :class:`Phase` ``IDLE`` and ``STEPPING``; an ended
or evicted one leaves the table (evicted ids are remembered, boundedly, to say so).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from kernel.errors import Conflict, InvalidInput, QueueFull
from kernel.json_shown import json_shown
from serve.dataplane.messages import SequenceStep

SequenceId = str | int
Owner = str | None  # a sequence_owner key; None: the sequences started without one
_Key = tuple[Owner, SequenceId]  # a sequence as the table holds it: its owner's, by its id


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
    def __init__(
        self, model: str, capacity: int, idle_timeout_s: float, per_owner: int | None = None
    ) -> None:
        self.model = model
        self.capacity = capacity
        self.idle_timeout_s = idle_timeout_s
        self.per_owner = per_owner  # sequences one owner holds at most; None: the capacity
        self._live: OrderedDict[_Key, _Sequence] = OrderedDict()  # least recent first
        self._evicted: OrderedDict[_Key, str] = OrderedDict()  # key -> why, bounded
        self._held: Counter[Owner] = Counter()  # live sequences by owner
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
        keys = _keys(step)
        continuing = [
            self._continuing(key, now)
            for key, start in zip(keys, step.starts, strict=True)
            if not start
        ]
        version = self._one_version(continuing)
        for key in keys:
            live = self._live.get(key)
            if live is not None and live.phase is Phase.STEPPING:
                raise _in_flight(key[1])
        rows = list(zip(keys, step.starts, strict=True))
        new = sum(1 for key, start in rows if start and key not in self._live)
        self._make_room(step.owner, new, set(keys), now)
        state = np.zeros((len(keys), size), np.float32)
        for row, (key, start) in enumerate(rows):
            if start:
                if key not in self._live:
                    self._held[key[0]] += 1
                self._live[key] = _Sequence(version, state[row], Phase.STEPPING, now)
                self._evicted.pop(key, None)
            else:
                live = self._live[key]
                state[row] = live.state
                live.phase = Phase.STEPPING
            self._live.move_to_end(key)
        return Held(state, version)

    def commit(
        self, step: SequenceStep, next_state: np.ndarray, version: int, now: float | None = None
    ) -> None:
        """The step answered: each sequence keeps its next state (ended ones leave)."""
        now = time.monotonic() if now is None else now
        for row, (key, end) in enumerate(zip(_keys(step), step.ends, strict=True)):
            if end:
                self._drop(key)
                continue
            live = self._live.get(key)
            if live is None:
                continue
            live.state = np.array(next_state[row], np.float32)
            live.version, live.phase, live.last_used = version, Phase.IDLE, now

    def abort(self, step: SequenceStep, now: float | None = None) -> None:
        """The step failed: its sequences are as before it (a start leaves none)."""
        now = time.monotonic() if now is None else now
        for key, start in zip(_keys(step), step.starts, strict=True):
            if start:
                self._drop(key)
                continue
            live = self._live.get(key)
            if live is not None:
                live.phase, live.last_used = Phase.IDLE, now

    def describe(self) -> dict[str, object]:
        stepping = sum(1 for s in self._live.values() if s.phase is Phase.STEPPING)
        return {
            "held": len(self._live),
            "stepping": stepping,
            "capacity": self.capacity,
            "per_owner": self.per_owner,
            "idle_timeout_s": self.idle_timeout_s,
            "evictions": self.evictions,
        }

    # ------------------------------------------------------------------ rules

    def _continuing(self, key: _Key, now: float) -> _Sequence:
        """The live sequence a row continues: its owner's (rule 7), else refused as unknown."""
        live = self._live.get(key)
        if live is not None and live.phase is Phase.IDLE and self._idle_too_long(live, now):
            self._evict(key, f"it was idle for more than {self.idle_timeout_s:g} s")
            live = None
        if live is None:
            why = self._evicted.get(key)
            shown = json_shown(key[1])
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
            raise _in_flight(key[1])
        return live

    def _one_version(self, continuing: list[_Sequence]) -> int | None:
        versions = sorted({live.version for live in continuing if live.version is not None})
        if len(versions) > 1:
            raise Conflict(
                f"sequences of this call run on versions {versions}: each keeps the version "
                "it started with; send their steps in separate calls"
            )
        return versions[0] if versions else None

    def _make_room(self, owner: Owner, new: int, stepping: set[_Key], now: float) -> None:
        """Room for ``owner``'s ``new`` sequences under its quota and in the table, evicting
        idle sequences not in this step (``stepping``): the owner's own, least recently used
        first, and, for a full table, anyone's idle past the timeout first (rule 5)."""
        if new == 0:
            return
        self._check_fits(new)
        quota = self.per_owner

        def over_quota() -> bool:
            return quota is not None and self._held[owner] + new > quota

        def full() -> bool:
            return len(self._live) + new > self.capacity

        def owners(key: _Key, live: _Sequence) -> bool:
            return key[0] == owner

        def expired(key: _Key, live: _Sequence) -> bool:
            return self._idle_too_long(live, now)

        quota_full = (
            f"its sequence_owner held max_sequences_per_owner ({quota}) sequences and it was "
            "their least recently used"
        )
        table_full = (
            f"the table of {self.capacity} sequences was full and it was the least recently used"
        )
        self._evict_while(over_quota, owners, stepping, now, quota_full)
        self._evict_while(full, expired, stepping, now, table_full)
        self._evict_while(full, owners, stepping, now, table_full)
        if over_quota():
            raise QueueFull(
                f"model {self.model!r}: this sequence_owner holds {self._held[owner]} "
                f"sequences, each with a step in flight (max_sequences_per_owner {quota}); "
                "retry shortly"
            )
        if full():
            raise QueueFull(self._no_room())

    def _check_fits(self, new: int) -> None:
        """A call never starts more sequences than one owner may hold: no retry would fit."""
        limit, setting = (
            (self.capacity, "max_held_sequences")
            if self.per_owner is None or self.per_owner >= self.capacity
            else (self.per_owner, "max_sequences_per_owner")
        )
        if new > limit:
            raise InvalidInput(
                f"this call starts {new} sequences; model {self.model!r} holds at most "
                f"{limit} of one sequence_owner ({setting}): start fewer in one call"
            )

    def _evict_while(
        self,
        short: Callable[[], bool],
        evictable: Callable[[_Key, _Sequence], bool],
        stepping: set[_Key],
        now: float,
        reason: str,
    ) -> None:
        """Evict idle sequences not in this step that ``evictable`` lets go, least recently
        used first, while room is ``short``; ``reason``: why, unless idle past the timeout."""
        for key, live in list(self._live.items()):
            if not short():
                return
            if live.phase is Phase.IDLE and key not in stepping and evictable(key, live):
                expired = self._idle_too_long(live, now)
                self._evict(
                    key,
                    f"it was idle for more than {self.idle_timeout_s:g} s" if expired else reason,
                )

    def _no_room(self) -> str:
        """Why a full table makes no room: every sequence in flight, or the others are other
        owners' live ones, which a new sequence never evicts (how many is not said)."""
        if all(live.phase is Phase.STEPPING for live in self._live.values()):
            return (
                f"model {self.model!r} holds {len(self._live)} sequences, each with a step in "
                f"flight (max_held_sequences {self.capacity}); retry shortly"
            )
        return (
            f"model {self.model!r} holds {self.capacity} sequences (max_held_sequences) and "
            "none this call may evict: a new sequence evicts its own sequence_owner's idle "
            "sequences and any idle past sequence_idle_timeout_s, never another owner's live "
            "one; retry shortly (max_sequences_per_owner keeps one owner from filling the table)"
        )

    def _idle_too_long(self, live: _Sequence, now: float) -> bool:
        return now - live.last_used > self.idle_timeout_s

    def _evict(self, key: _Key, why: str) -> None:
        self._drop(key)
        self._evicted[key] = why
        self.evictions += 1
        while len(self._evicted) > self.capacity:
            self._evicted.popitem(last=False)

    def _drop(self, key: _Key) -> None:
        """``key``'s sequence leaves the table (if live), and its owner's count with it."""
        if self._live.pop(key, None) is None:
            return
        self._held[key[0]] -= 1
        if not self._held[key[0]]:
            del self._held[key[0]]


def _keys(step: SequenceStep) -> list[_Key]:
    """The step's sequences as the table holds them: under the step's owner (rule 7)."""
    return [(step.owner, sequence_id) for sequence_id in step.ids]


def _in_flight(sequence_id: SequenceId) -> Conflict:
    return Conflict(
        f"sequence_id {json_shown(sequence_id)}: a step of this sequence is in flight; send "
        "the next step once it has answered (its state comes from that answer)"
    )
