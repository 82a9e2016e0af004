"""The one thing a language model's event-loop side and its decoding thread share: the
hand-over, with the messages that cross it.

The event loop puts admitted :class:`Request` messages in its queue and withdraws those it
answered itself (the client went away, the deadline passed); it holds, resumes and stops
the scheduler here (``serve.lm.scheduling.state``). At each step boundary the decoding
thread takes a :class:`Step` (who joins, under the step rules of
``serve.lm.scheduling.step_plan``, and who left), and after steps it hands back
:class:`Handed` messages (outcomes per request id, and a record for the metrics); the loop
is woken once for whatever is waiting. The thread also reports a :class:`ThreadStatus`
(what it runs, and since when its step has been running) for health, the metrics and
version pinning.

Everything here is behind one lock; nothing else is touched by both threads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from enum import Enum

from kernel.errors import RLServeError
from serve.lm.messages import Generation, GenerationResult, ScoreResult, Scoring, TokenEvent
from serve.lm.scheduling.generation_record import StepRecord
from serve.lm.scheduling.state import Control, SchedulerState, transition
from serve.lm.scheduling.step_plan import Occupancy, StepLimits, Waiting, plan_step

__all__ = [
    "Handed",
    "Handover",
    "Outcome",
    "Refusal",
    "Request",
    "Started",
    "Step",
    "ThreadStatus",
]


@dataclass(frozen=True, slots=True)
class Request:
    """One admitted request, as the event loop hands it to the decoding thread."""

    id: int
    work: Generation | Scoring  # prepared by the version work.version
    version: int | None  # pinned (named by the caller, or by a draining swap); None: active
    streamed: bool  # its token events are wanted
    waiting: Waiting  # what the step rules need to know of it

    @staticmethod
    def of(id: int, work: Generation | Scoring, version: int | None, *, streamed: bool) -> Request:
        deadline = work.spec.deadline
        if isinstance(work, Scoring):
            waiting = Waiting(work.tokens, 0, 0, deadline)
        else:
            prompt = len(work.prompt_ids)
            reserve = prompt + work.max_new_tokens
            waiting = Waiting(prompt, reserve, 1, deadline, hash(work.prompt_ids))
        return Request(id, work, version, streamed, waiting)


@dataclass(frozen=True, slots=True)
class Started:
    """A streamed generation's version, known from its first token."""

    version: int
    sha256: str


Outcome = Started | TokenEvent | GenerationResult | ScoreResult | RLServeError


@dataclass(frozen=True, slots=True)
class Handed:
    """What the decoding thread hands the event loop at once: outcomes of steps, by request
    id, and the metrics of the steps since the last record (None: they go with a later one)."""

    outcomes: list[tuple[int, Outcome]]
    record: StepRecord | None


@dataclass(frozen=True, slots=True)
class Step:
    """What a step boundary gives the decoding thread: the requests that join now, and the
    ids the event loop answered itself since the last boundary (they leave the batch)."""

    joining: list[Request]
    gone: frozenset[int]


@dataclass(frozen=True, slots=True)
class ThreadStatus:
    """What the decoding thread last reported."""

    sequences: int  # running in its batches
    versions: frozenset[int]  # the versions those batches run on
    step_since: float | None  # a step is running since then (monotonic; None: between steps)


IDLE = ThreadStatus(0, frozenset(), None)


class Refusal(Enum):
    STOPPED = "stopped"
    FULL = "full"


class Handover:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # work, or the state, changed
        self._state = SchedulerState.NEW
        self._queue: deque[Request] = deque()
        self._expired: set[int] = set()  # left the queue past their deadline; the loop answers
        self._gone: set[int] = set()  # answered by the loop while they ran
        self._handed: list[Handed] = []  # handed over, not yet taken by the loop
        self._status = IDLE
        self._wake: Callable[[], None] = _nobody  # asks the loop to take what is handed

    # ------------------------------------------------------------------ the event loop's

    def start(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wake = wake
            self._state = transition(self._state, Control.START)

    def control(self, control: Control) -> None:
        with self._changed:
            self._state = transition(self._state, control)
            self._changed.notify()

    @property
    def state(self) -> SchedulerState:
        with self._lock:
            return self._state

    @property
    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def status(self) -> ThreadStatus:
        with self._lock:
            return self._status

    def refusal(self, requests: int, max_queue: int) -> Refusal | None:
        with self._lock:
            if not self._state.admits:
                return Refusal.STOPPED
            if len(self._queue) + requests > max_queue:
                return Refusal.FULL
            return None

    def put(self, request: Request) -> None:
        with self._changed:
            self._queue.append(request)
            self._changed.notify()

    def withdraw(self, ids: Collection[int]) -> set[int]:
        """The loop answered these: those still queued leave it (returned: they never
        ran), the others leave the batch at the next step boundary."""
        wanted = set(ids)
        with self._lock:
            queued = {r.id for r in self._queue if r.id in wanted}
            if queued:
                self._queue = deque(r for r in self._queue if r.id not in queued)
            never_ran = queued | (wanted & self._expired)
            self._expired -= wanted
            self._gone |= wanted - never_ran
        return never_ran

    def pin_queued(self, version: int) -> None:
        with self._lock:
            self._queue = deque(
                replace(r, version=version) if r.version is None else r for r in self._queue
            )

    def pinned_versions(self) -> set[int]:
        with self._lock:
            queued = {r.version for r in self._queue if r.version is not None}
            return queued | self._status.versions

    def take(self) -> tuple[list[Handed], SchedulerState]:
        with self._lock:
            handed, self._handed = self._handed, []
            return handed, self._state

    # ------------------------------------------------------------------ the decoding thread's

    def next_step(self, running: Occupancy, limits: StepLimits) -> Step | None:
        """What this step boundary brings; None when there is nothing to do now."""
        with self._lock:
            if not self._has_work(running.sequences):
                return None
            joining: list[Request] = []
            if self._queue:
                queue = list(self._queue)
                plan = plan_step([r.waiting for r in queue], running, time.monotonic(), limits)
                self._expired.update(queue[i].id for i in plan.expired)
                chosen = {*plan.join, *plan.expired}
                self._queue = deque(r for i, r in enumerate(queue) if i not in chosen)
                joining = [queue[i] for i in plan.join]
            gone, self._gone = frozenset(self._gone), set()
            status = self._status
            self._status = ThreadStatus(status.sequences, status.versions, time.monotonic())
            return Step(joining, gone)

    def report(self, status: ThreadStatus) -> None:
        with self._lock:
            self._status = status

    def wait(self, sequences: int) -> bool:
        """Wait for work; False once stopping left nothing to do (then it is STOPPED)."""
        with self._changed:
            while not self._has_work(sequences):
                if self._state is SchedulerState.STOPPING and not self._queue and not sequences:
                    self._state = transition(self._state, Control.DRAINED)
                    if not self._handed:  # else the loop is already woken, and sees it
                        self._wake()
                    return False
                self._changed.wait()
            return True

    def hand(self, handed: Handed) -> None:
        with self._lock:
            wake = not self._handed  # else the loop is already woken for the earlier ones
            self._handed.append(handed)
        if wake:
            self._wake()

    def _has_work(self, sequences: int) -> bool:
        return self._state.steps and (bool(self._queue) or sequences > 0)


def _nobody() -> None:
    """Before the scheduler starts there is no loop to wake."""
