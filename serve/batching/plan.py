"""How a batch is formed: a pure function of the queue, the clock and the batch limits.

The dynamic batch scheduler (``serve.batching.dynamic_batcher``) asks :func:`plan` what to
do with the head of its queue whenever the model is idle and something changed, and does
it. Nothing here touches asyncio or onnxruntime, so the rules are tested with plain numbers.

Batching is *work-conserving*: a model never idles while rows wait. Rows that arrive while
a batch runs form the next batch, released as soon as the running one ends; with
``max_wait_s`` 0 (the default) a request that finds the model idle runs at once.
``max_wait_s`` > 0 opts into waiting for fuller batches, which pays where a batch costs
little more than a row (GPUs).

The rules, in order:

1. Requests whose deadline has passed are *expired*: answered 504 and never executed.
2. Rows are gathered from the head of the queue (first come, first served, never
   reordered) up to ``max_batch_size`` rows, all for the version the head runs on: a
   batch never mixes model versions. A request for another version keeps its place and
   heads a later batch; the gathering goes on past it (a canary's calls interleave with
   the live version's: stopping at each one would cut every batch short).
3. The batch is released at once when it is full, when the next request does not fit,
   when ``max_wait_s`` has passed since the oldest request arrived, or when waiting any
   longer would make some gathered request miss its deadline given the expected run time.
4. Otherwise the scheduler waits until the earliest of those moments, or a new arrival.
5. *Company*: a request that finds the model idle moments after a batch of several rows
   was answered (within ``COMPANY_WINDOW_S``) is planned ``COMPANY_TURNS`` turns of the
   event loop later instead of in the next one (:func:`company_turns`). The callers just
   answered are sending their next requests: one turn reads them from their sockets, the
   next decodes them into the queue, so a closed loop of clients (RL actors, a load
   generator) stays in one batch instead of splitting into groups that each pay a batch's
   fixed cost. Gathering ends after the turn in which ``COMPANY_WAIT_S`` passed: when
   turns take that long, many calls are being read and the batch fills anyway. A lone
   caller (batches of one row) never waits, nor does a model idle for longer than the
   window, nor a request whose deadline leaves less than that wait.

Padding a batch to a warmed size is the model's business (GPU providers want it, the CPU
does not): :func:`buckets_for` and :func:`bucket` give the sizes it warms and pads to.

Admission (:func:`admission`): a request is refused at once (429) when it would overfill
the queue, or when the rows queued ahead of it would take longer to serve than its deadline
allows (:func:`admission_wait_s`), at the rate the queue has been measured to drain while
it was backlogged (:class:`DrainRate`). A request that finds nothing ahead of it is
admitted; a scheduler that is starting or stopping admits nothing (503).

Where a batch runs is decided by :class:`RunTimes`: inline on the event loop while batches
of its size have been measured to run under a threshold (a thread hop costs more than a
small model), on the scheduler's thread above it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

# Waiting and Plan are made for every queued request at every plan: plain slotted classes,
# as a frozen dataclass pays an object.__setattr__ per field (most of a lone request's plan).


@dataclass(slots=True)
class Waiting:
    """What the rules need to know about one queued request."""

    rows: int
    enqueued_at: float  # monotonic seconds
    deadline: float  # monotonic seconds
    version: int = 0  # the model version this request runs on


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int
    max_wait_s: float


@dataclass(slots=True)
class Plan:
    expired: tuple[int, ...]  # queue indices to answer 504 without running
    take: tuple[int, ...]  # queue indices to run now, in order; empty means wait
    wait_s: float  # when take is empty: how long to wait before planning again


def buckets_for(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two below max_batch_size, and max_batch_size itself."""
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if (1 << i) < max_batch_size]
    return (*sizes, max_batch_size)


def bucket(rows: int, buckets: Sequence[int]) -> int:
    return next(b for b in buckets if b >= rows)


def plan(queue: Sequence[Waiting], now: float, limits: BatchLimits, expected_run_s: float) -> Plan:
    live = [i for i, w in enumerate(queue) if w.deadline > now]
    expired: tuple[int, ...] = ()
    if len(live) < len(queue):
        expired = tuple(i for i, w in enumerate(queue) if w.deadline <= now)
    take, rows = _gather(queue, live, limits.max_batch_size)
    if not take:
        return Plan(expired, (), wait_s=0.0)
    release_at = _release_time(queue, take, live, rows, limits, expected_run_s)
    if release_at <= now:
        return Plan(expired, tuple(take), wait_s=0.0)
    return Plan(expired, (), wait_s=release_at - now)


def _gather(queue: Sequence[Waiting], live: list[int], limit: int) -> tuple[list[int], int]:
    take: list[int] = []
    rows = 0
    version = queue[live[0]].version if live else 0
    for i in live:
        if queue[i].version != version:
            continue  # the next batch's
        if rows + queue[i].rows > limit:
            break
        take.append(i)
        rows += queue[i].rows
    return take, rows


def _release_time(
    queue: Sequence[Waiting],
    take: list[int],
    live: list[int],
    rows: int,
    limits: BatchLimits,
    expected_run_s: float,
) -> float:
    """The moment the gathered batch must go; in the past or now means release at once."""
    blocked = len(take) < len(live)  # the next request cannot join: nothing more can
    if rows >= limits.max_batch_size or blocked:
        return -math.inf
    oldest = tightest = math.inf
    for i in take:
        oldest = min(oldest, queue[i].enqueued_at)
        tightest = min(tightest, queue[i].deadline)
    return min(oldest + limits.max_wait_s, tightest - expected_run_s)


COMPANY_TURNS = 3  # turns of the event loop from an arrival to its plan (1: the next turn)
COMPANY_WINDOW_S = 0.002  # how recently a batch of several rows was answered
COMPANY_WAIT_S = 0.001  # gathering stops after the turn that passes this


def company_turns(answered_rows: int, since_answered_s: float, slack_s: float) -> int:
    """Rule 5: in which turn of the event loop to plan a batch for a model that was idle,
    ``since_answered_s`` after the last batch, of ``answered_rows`` rows, was answered;
    ``slack_s``: how long the arriving request can wait and still be run by its deadline."""
    recent = answered_rows > 1 and since_answered_s < COMPANY_WINDOW_S
    if recent and slack_s > COMPANY_WAIT_S:
        return COMPANY_TURNS
    return 1


class Refused(Enum):
    """Why a request is not admitted."""

    STOPPED = "stopped"  # starting or shutting down
    FULL = "full"  # max_queue_rows reached
    LATE = "late"  # the rows ahead would make it miss its deadline


@dataclass(slots=True)
class Backlog:
    """A model's rows queued and running, and how many may queue (made for every request
    admitted: not frozen, see Waiting)."""

    queued: int
    running: int
    max_queued: int


def admission(
    backlog: Backlog,
    rows: int,
    budget_s: float,
    seconds_per_row: float,
    *,
    serving: bool,
    held: bool,
) -> Refused | None:
    """Admission: why a request of ``rows`` rows with ``budget_s`` left before its deadline
    is refused now, or None when it is admitted. A scheduler that is not serving (starting
    or stopping) admits nothing; a queue never holds more than ``max_queued`` rows; a held
    model admits what fits, to wait for the resume within its deadline; otherwise the rows
    ahead must be served within the budget at the measured drain rate."""
    if not serving:
        return Refused.STOPPED
    if backlog.queued + rows > backlog.max_queued:
        return Refused.FULL
    if held:
        return None
    ahead = backlog.queued + backlog.running
    if admission_wait_s(ahead, rows, seconds_per_row) > budget_s:
        return Refused.LATE
    return None


def admission_wait_s(rows_ahead: int, rows: int, seconds_per_row: float) -> float:
    """How long until a request's last row is answered, at the measured drain rate, with
    ``rows_ahead`` rows queued or running before it; 0 when nothing is ahead."""
    if rows_ahead <= 0:
        return 0.0
    return (rows_ahead + rows) * seconds_per_row


class DrainRate:
    """How fast the queue empties while it is backlogged: seconds per row, from the time
    between batch starts (the run, answering its requests, and everything else the process
    did meanwhile: reading requests, refusing some), summed over windows of at least
    ``window_s`` and averaged over recent windows. Before the first window, the batches'
    run time per row.

    A median of recent windows would ignore one window stretched by a pause (which now
    makes admission refuse for a moment what it could serve); tried, it followed the onset
    of overload later, admitted more calls that then expired queued (504s twice as many,
    429s fewer) and kept 51-71% of the saturation goodput at 10x in three of four runs
    (once 103%), against 70-96% in three runs of this one (2026-12-05)."""

    def __init__(self, window_s: float = 0.02, weight: float = 0.3) -> None:
        self.seconds_per_row = 0.0
        self._window_s, self._weight = window_s, weight
        self._last_start: float | None = None
        self._last_rows = 0
        self._rows = 0
        self._elapsed = 0.0

    def started(self, now: float, rows: int, *, backlogged: bool) -> None:
        """A batch of ``rows`` started now; ``backlogged``: rows were waiting when the
        previous batch ended (so the time since it started was all spent draining)."""
        if backlogged and self._last_start is not None:
            self._rows += self._last_rows
            self._elapsed += now - self._last_start
            if self._elapsed >= self._window_s:
                sample = self._elapsed / self._rows
                previous, weight = self.seconds_per_row, self._weight
                self.seconds_per_row = (
                    sample if not previous else (1 - weight) * previous + weight * sample
                )
                self._rows, self._elapsed = 0, 0.0
        self._last_start, self._last_rows = now, rows

    def per_row(self, run_s_per_row: float) -> float:
        return self.seconds_per_row or run_s_per_row


class RunTimes:
    """Measured batch run times, and where the next batch of a given size should run.

    A batch's cost depends on its rows, so runs are kept per size class (1, 2-3, 4-7, ...).
    A class runs inline while the median of its last inline runs is under the threshold:
    an inline run's wall time is exactly how long it holds the event loop, and a median
    shrugs off the odd pause. Runs on the thread take longer than that on a busy machine
    (they also wait for the interpreter lock), so they do not count towards the decision;
    instead a class that went to the thread is run inline once more now and then (after
    ``first_probe`` batches, then twice as many each time it is still too slow), to notice
    when it became cheap again. ``expected_s`` averages every run, wherever it ran: the
    planner's estimate of the next batch.
    """

    def __init__(
        self,
        inline_below_s: float,
        *,
        window: int = 9,
        first_probe: int = 16,
        last_probe: int = 1024,
        weight: float = 0.2,
    ) -> None:
        self.inline_below_s = inline_below_s
        self.expected_s = 0.0
        self._window = window
        self._first_probe, self._last_probe = first_probe, last_probe
        self._weight = weight
        self._classes: dict[int, _SizeClass] = {}

    def add(self, rows: int, run_s: float, *, inline: bool) -> None:
        previous = self.expected_s
        self.expected_s = (
            run_s if not previous else ((1 - self._weight) * previous + self._weight * run_s)
        )
        if inline:
            self._class(rows).measured(run_s, self.inline_below_s)

    def inline(self, rows: int) -> bool:
        """Whether batches of this many rows run on the event loop now."""
        return self.inline_below_s > 0 and self._class(rows).cheap

    def next_inline(self, rows: int) -> bool:
        """Where the next batch of ``rows`` runs: inline while cheap; now and then a probe."""
        if self.inline_below_s <= 0:
            return False
        size = self._class(rows)
        if size.cheap:
            size.probe_every = self._first_probe
            return True
        size.since_probe += 1
        if size.since_probe < size.probe_every:
            return False
        size.since_probe = 0
        size.probe_every = min(size.probe_every * 2, self._last_probe)
        return True

    def _class(self, rows: int) -> _SizeClass:
        key = rows.bit_length()
        found = self._classes.get(key)
        if found is None:
            found = self._classes[key] = _SizeClass(deque(maxlen=self._window), self._first_probe)
        return found


@dataclass
class _SizeClass:
    inline_runs: deque[float]
    probe_every: int
    since_probe: int = 0
    cheap: bool = True  # the median of the recent inline runs is under the threshold
    slow: int = 0  # how many of inline_runs are at or over the threshold

    def measured(self, run_s: float, threshold_s: float) -> None:
        """One more inline run (``threshold_s`` is the same for every run of a class)."""
        runs = self.inline_runs
        if len(runs) == runs.maxlen and runs[0] >= threshold_s:
            self.slow -= 1  # the oldest run leaves the window
        runs.append(run_s)
        if run_s >= threshold_s:
            self.slow += 1
        self.cheap = 2 * self.slow < len(runs) or (
            2 * self.slow == len(runs) and statistics.median(runs) < threshold_s
        )
