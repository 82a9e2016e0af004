"""The dynamic batch scheduler: one per model, work-conserving.

Requests are admitted into a bounded queue (counted in rows, ``serve.batching.row_queue``),
and only while the rows ahead of them can be served within their deadline at the measured
pace (``batching.admission_wait_s``): under overload the excess is refused at once with 429,
so admitted requests are answered in time instead of everyone timing out. A request larger
than ``max_batch_size`` is cut into parts pinned to one version (``serve.batching.split``).

Whenever the model is idle and something changed, the scheduler asks
``serve.batching.plan.plan`` what to do with the head of the queue and does it: a
request that finds the model idle runs at once, together with whatever arrived in the same
turn of the event loop; rows that arrive while a batch runs form the next batch, released
when the running one ends. Moments after a batch of several rows was answered, the plan
lets two more turns pass, in which the callers just answered send again and join
(``batching.company_turns``). One batch runs at a time per model.

A batch runs inline on the event loop while batches are cheap, on the scheduler's thread
when they are not (``batching.RunTimes``, from measured run times). While a backlog waits,
inline batches follow each other for up to ``CHAIN_S`` before the loop takes its turn. A
batch's outputs become one :class:`~serve.batching.record.BatchRecord`, handed to every
record sink (metrics, and whatever a deployment adds), and each request's answer is cut
from it (``serve.batching.batch_run``).

Deadlines are kept by one timer per scheduler, set for the earliest deadline in flight: a
request still queued when its deadline passes is answered 504 and never runs; one whose
batch is still running is answered 504 at its deadline.

Each request runs on the version it names, or else on the version that is active when its
batch forms; every answer is stamped with the version that computed it.

The scheduler is two state machines. :class:`Life` is what it admits: nothing before
``start`` or once stopping. :class:`Phase` is what it is doing about its queue, and every
move between phases goes through ``_enter``, which checks it against ``TRANSITIONS``::

    from        what happens                               to
    IDLE        a request arrives                          PLANNING
                one arrives moments after a batch of rows  GATHERING
    GATHERING   its turns passed; a full batch; stop       PLANNING
    PLANNING    the plan releases a batch                  RUNNING
                the plan waits for company (max_wait_ms)   WAITING
                only expired requests left the queue       PLANNING
                the batch's version was unloaded           PLANNING
                nothing is queued                          IDLE
    WAITING     its timer; a full batch queued; stop       PLANNING
    RUNNING     the batch ends, rows wait                  PLANNING (at once within CHAIN_S)
                the batch ends, rows wait, a hold          HELD
                the batch ends, nothing is queued          IDLE
    HELD        resume or stop                             PLANNING, or IDLE if none queued
    IDLE, PLANNING, WAITING, GATHERING: hold               HELD

A hold arriving while a batch runs lets it finish; the scheduler is HELD when it ends.
Stopping runs what is queued (a hold included) without waiting for fuller batches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kernel.errors import (
    DeadlineExceeded,
    InvalidInput,
    QueueFull,
    RLServeError,
    ServiceUnavailable,
)
from serve.batching import split
from serve.batching.batch_run import Execution, deliver, execute, lost, settle
from serve.batching.plan import (
    COMPANY_WAIT_S,
    Backlog,
    BatchLimits,
    DrainRate,
    Refused,
    RunTimes,
    Waiting,
    admission,
    admission_wait_s,
    buckets_for,
    company_turns,
    plan,
)
from serve.batching.record import RecordSink
from serve.batching.row_queue import RowQueue, Ticket
from serve.config import ModelSettings
from serve.dataplane.messages import InferenceResponse, Prepared
from serve.dataplane.model import ServedModel, VersionSource
from serve.dataplane.scheduler import NOT_RUN, Load

# Inline batches run back to back, without a turn of the event loop in between, for this
# long while rows wait: under a backlog each turn of the loop serves several batches, so
# the work of reading (and refusing) requests is shared by more answered rows.
CHAIN_S = 0.002


class Life(Enum):
    """What the scheduler admits."""

    NEW = "new"  # no event loop yet: refuses every request
    SERVING = "serving"
    STOPPING = "stopping"  # refuses new requests, runs the queued ones without waiting
    STOPPED = "stopped"  # every request answered; not alive


class Phase(Enum):
    """What the scheduler is doing about its queue."""

    IDLE = "idle"  # nothing queued, nothing running
    PLANNING = "planning"  # a plan is due, in this turn of the event loop
    WAITING = "waiting"  # queued rows wait for company: a timer is set for their release
    GATHERING = "gathering"  # the plan waits a few turns of the loop for callers just answered
    RUNNING = "running"  # a batch executes, inline or on the thread; arrivals queue
    HELD = "held"  # a hold: queued rows wait for resume or stop, nothing is planned

    # Members are singletons: hashed by identity, in C (Enum's own hash is Python code,
    # and every transition looks a phase up in TRANSITIONS).
    __hash__ = object.__hash__


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.IDLE: frozenset({Phase.PLANNING, Phase.GATHERING, Phase.HELD}),
    Phase.PLANNING: frozenset(
        {Phase.RUNNING, Phase.WAITING, Phase.PLANNING, Phase.IDLE, Phase.HELD}
    ),
    Phase.WAITING: frozenset({Phase.PLANNING, Phase.HELD}),
    Phase.GATHERING: frozenset({Phase.PLANNING, Phase.HELD}),
    Phase.RUNNING: frozenset({Phase.PLANNING, Phase.HELD, Phase.IDLE}),
    Phase.HELD: frozenset({Phase.PLANNING, Phase.IDLE}),
}


_PLAN_PENDING = frozenset({Phase.IDLE, Phase.PLANNING, Phase.WAITING, Phase.GATHERING})


@dataclass(slots=True)
class _Batch:
    """The batch that runs (in the RUNNING phase)."""

    tickets: list[Ticket]
    rows: int
    started: float  # monotonic seconds

    def answer_late(self, now: float) -> None:
        """Answer 504 to its requests whose deadline passed while it runs."""
        for ticket in self.tickets:
            if ticket.prepared.deadline <= now:
                budget_ms = (ticket.prepared.deadline - ticket.prepared.received_at) * 1000
                late = f"no answer within the request's deadline of {budget_ms:g} ms"
                settle(ticket, DeadlineExceeded(late))


_NO_BATCH = _Batch([], 0, 0.0)


@dataclass(slots=True)
class _Pace:
    """The scheduler's measurements: how long batches run, how fast the queue drains."""

    run_times: RunTimes
    drain: DrainRate
    backlogged: bool = False  # rows were waiting when the last batch ended
    answered_rows: int = 0  # the last batch's rows
    answered_at: float = -math.inf  # when it ended (monotonic s)
    chain_until: float = 0.0  # inline batches may follow each other until then

    def row_s(self, max_batch_size: int) -> float:
        """Seconds per row at the measured drain rate (or the batches' run time)."""
        return self.drain.per_row(self.run_times.expected_s / max_batch_size)


class _DeadlineTimer:
    """One timer, set for the earliest deadline in flight."""

    def __init__(self, expire: Callable[[], None]) -> None:
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    def watch(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        if deadline < self._at:
            self.cancel()
            self._at = deadline
            delay = max(0.0, deadline - time.monotonic())
            self._handle = loop.call_later(delay, self._fired)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._at = None, math.inf

    def _fired(self) -> None:
        self._handle, self._at = None, math.inf
        self._expire()


class _PlanCall:
    """When the scheduler's next plan is called, one call at a time: in the next turn of the
    event loop (PLANNING), after a few turns (GATHERING: planned in the last one, or once
    ``until`` passed, as a busy loop's turns are long and reading is under way), or after a
    wait (WAITING)."""

    def __init__(self, due: Callable[[], None]) -> None:
        self._due = due
        self._handle: asyncio.Handle | None = None

    def soon(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = loop.call_soon(self._call)

    def after_turns(self, loop: asyncio.AbstractEventLoop, turns: int, until: float) -> None:
        self._handle = loop.call_soon(self._turned, loop, turns, until)

    def later(self, loop: asyncio.AbstractEventLoop, wait_s: float) -> None:
        self._handle = loop.call_later(wait_s, self._call)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _call(self) -> None:
        self._handle = None
        self._due()

    def _turned(self, loop: asyncio.AbstractEventLoop, left: int, until: float) -> None:
        if left > 1 and time.monotonic() < until:
            self._handle = loop.call_soon(self._turned, loop, left - 1, until)
        else:
            self._call()


class DynamicBatchScheduler:
    def __init__(
        self,
        name: str,
        versions: VersionSource,
        settings: ModelSettings,
        sinks: Sequence[RecordSink],
    ) -> None:
        self.name = name
        self.versions = versions
        self.held = False  # the control plane's hold (``hold``, ``resume``)
        self.life = Life.NEW
        self.phase = Phase.IDLE
        self.limits = BatchLimits(settings.max_batch_size, settings.max_wait_ms / 1000)
        self.max_queue_rows = settings.max_queue_rows
        self.pace = _Pace(RunTimes(settings.inline_max_ms / 1000), DrainRate())
        self._sinks = tuple(sinks)
        self._queue = RowQueue()
        self._batch = _NO_BATCH
        self._plan_call = _PlanCall(self._due)
        self._deadlines = _DeadlineTimer(self._expire)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._stopped = asyncio.Event()

    # ------------------------------------------------------------------ admission

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.life is Life.NEW:
            self.life = Life.SERVING

    def submit(self, prepared: Prepared, version: int | None) -> asyncio.Future[InferenceResponse]:
        if prepared.rows > self.max_queue_rows:
            raise InvalidInput(
                f"observations: {prepared.rows} rows; model {self.name!r} queues at most "
                f"{self.max_queue_rows} (max_queue_rows): send fewer per request"
            )
        self.admit(prepared.rows, prepared.deadline)
        if prepared.rows > self.limits.max_batch_size:
            return self._submit_parts(prepared, version)
        return self._enqueue(prepared, version)

    @property
    def max_batch_size(self) -> int:
        return self.limits.max_batch_size

    @property
    def sinks(self) -> Sequence[RecordSink]:
        return self._sinks

    def admit(self, rows: int, deadline: float) -> None:
        """Refuse now what cannot be served: the queue is full, or the rows ahead would
        take longer than the deadline allows (raises QueueFull, ServiceUnavailable)."""
        refused = self._refused(rows, deadline)
        if refused is not None:
            queued, running = self._queue.rows, self._batch.rows
            row_s = self.pace.row_s(self.limits.max_batch_size)
            raise _refusal(self, refused, (queued, running, rows), row_s, deadline)

    def would_admit(self, rows: int, deadline: float) -> bool:
        """``admit``'s decision alone, without building an error: the cheap question a
        frontend asks for every call while the process is overloaded."""
        return self._refused(rows, deadline) is None

    def _refused(self, rows: int, deadline: float) -> Refused | None:
        """Why ``rows`` rows due by ``deadline`` cannot be admitted now (None: they can)."""
        queue = Backlog(self._queue.rows, self._batch.rows, self.max_queue_rows)
        row_s = self.pace.row_s(self.limits.max_batch_size)
        budget_s = deadline - time.monotonic()
        serving = self.life is Life.SERVING
        return admission(queue, rows, budget_s, row_s, serving=serving, held=self.held)

    def _submit_parts(
        self, prepared: Prepared, version: int | None
    ) -> asyncio.Future[InferenceResponse]:
        assert self._loop is not None
        pinned = version if version is not None else self.versions.active
        if pinned is None:
            raise ServiceUnavailable(f"model {self.name!r} has no active version")
        parts = split.split(prepared, self.limits.max_batch_size)
        return split.joined([self._enqueue(part, pinned) for part in parts], self._loop)

    def _enqueue(
        self, prepared: Prepared, version: int | None
    ) -> asyncio.Future[InferenceResponse]:
        assert self._loop is not None
        future: asyncio.Future[InferenceResponse] = self._loop.create_future()
        self._queue.append(Ticket(prepared, time.monotonic(), version, future))
        self._deadlines.watch(self._loop, prepared.deadline)
        self._arrived(prepared.deadline)
        return future

    # ------------------------------------------------------------------ control

    def pin_queued(self, version: int) -> None:
        self._queue.pin(version)

    def pinned_versions(self) -> set[int]:
        return self._queue.pinned()

    def hold(self) -> None:
        self.held = True
        if self._holding() and self.phase in _PLAN_PENDING:
            self._plan_call.cancel()
            self._enter(Phase.HELD)

    def resume(self) -> None:
        self.held = False
        if self.phase is Phase.HELD:
            self._after_hold()

    # ------------------------------------------------------------------ transitions

    def _enter(self, phase: Phase) -> None:
        assert phase in TRANSITIONS[self.phase], f"{self.phase} -> {phase}"
        self.phase = phase
        if phase is Phase.IDLE and self.life is Life.STOPPING:
            self.life = Life.STOPPED
            self._stopped.set()

    def _holding(self) -> bool:
        """Whether a hold keeps queued rows from running (stopping runs them anyway)."""
        return self.held and self.life is not Life.STOPPING

    def _arrived(self, deadline: float) -> None:
        """IDLE -> PLANNING or GATHERING (``company_turns``); WAITING or GATHERING ->
        PLANNING once the queue holds a full batch. The plan comes after the requests that
        arrived with this one have joined the queue."""
        if self.phase is Phase.IDLE:
            pace, now = self.pace, time.monotonic()
            slack_s = deadline - now - pace.run_times.expected_s
            turns = company_turns(pace.answered_rows, now - pace.answered_at, slack_s)
            if turns > 1:
                self._gather(turns)
            else:
                self._plan_soon()
        elif (
            self.phase in (Phase.WAITING, Phase.GATHERING)
            and self._queue.rows >= self.limits.max_batch_size
        ):
            self._plan_call.cancel()
            self._plan_soon()

    def _after_hold(self) -> None:
        """HELD -> PLANNING when rows wait, else IDLE."""
        if self._queue:
            self._plan_soon()
        else:
            self._enter(Phase.IDLE)

    def _plan_soon(self) -> None:
        assert self._loop is not None
        self._enter(Phase.PLANNING)
        self._plan_call.soon(self._loop)

    def _gather(self, turns: int) -> None:
        assert self._loop is not None
        self._enter(Phase.GATHERING)
        self._plan_call.after_turns(self._loop, turns, time.monotonic() + COMPANY_WAIT_S)

    def _wait(self, wait_s: float) -> None:
        assert self._loop is not None
        self._enter(Phase.WAITING)
        self._plan_call.later(self._loop, wait_s)

    def _due(self) -> None:
        """The plan's call is due (PLANNING, WAITING's timer, GATHERING's last turn)."""
        self.pace.chain_until = time.monotonic() + CHAIN_S
        if self.phase is not Phase.PLANNING:
            self._enter(Phase.PLANNING)
        self._plan()

    # ------------------------------------------------------------------ forming batches

    def _plan(self) -> None:
        """PLANNING: do what ``batching.plan`` says with the head of the queue; while
        inline batches may follow each other (``CHAIN_S``), plan the next one at once."""
        while True:
            self._queue.drop_settled()
            window = self._queue.window(self.limits.max_batch_size)
            if not window:
                self._enter(Phase.IDLE)
                return
            execution = self._release(window)
            if execution is None or not self._ended(execution):
                return

    def _release(self, window: list[Ticket]) -> Execution | None:
        """Plan the window and do it: the batch's execution when it ran inline."""
        waiting = _waiting(window, self.versions.active or 0)
        limits = self.limits
        if self.life is Life.STOPPING:
            limits = dataclasses.replace(limits, max_wait_s=0.0)
        decision = plan(waiting, time.monotonic(), limits, self.pace.run_times.expected_s)
        expired, batch = self._queue.pop(window, decision.expired, decision.take)
        for ticket in expired:
            settle(ticket, DeadlineExceeded(NOT_RUN))
        if batch:
            return self._run(batch, waiting[decision.take[0]].version)
        if decision.wait_s > 0:
            self._wait(decision.wait_s)
        elif self._queue:
            self._plan_soon()  # only expired ones went
        else:
            self._enter(Phase.IDLE)
        return None

    # ------------------------------------------------------------------ running batches

    def _run(self, batch: list[Ticket], version: int) -> Execution | None:
        """PLANNING -> RUNNING: the execution when the batch ran inline; None when it runs
        on the thread (``_ended`` follows) or its version is gone."""
        assert self._loop is not None
        model = self.versions.get(version)
        if model is None:
            gone = ServiceUnavailable(f"model {self.name!r} version {version} was unloaded")
            for ticket in batch:
                settle(ticket, gone)
            self._plan_soon()
            return None
        self._enter(Phase.RUNNING)
        self._batch = _Batch(batch, sum(t.prepared.rows for t in batch), time.monotonic())
        rows, pace = self._batch.rows, self.pace
        pace.drain.started(self._batch.started, rows, backlogged=pace.backlogged)
        if pace.run_times.next_inline(rows):
            return execute(model, batch, rows, inline=True)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"batch-{self.name}")
        running = self._loop.run_in_executor(self._executor, execute, model, batch, rows, False)
        running.add_done_callback(lambda done: self._thread_done(done, model, batch, rows))
        return None

    def _thread_done(
        self, done: asyncio.Future[Execution], model: ServedModel, batch: list[Ticket], rows: int
    ) -> None:
        failed = done.cancelled() or done.exception() is not None
        if self._ended(lost(model, batch, rows) if failed else done.result()):
            self._plan()

    def _ended(self, execution: Execution) -> bool:
        """RUNNING -> PLANNING, HELD or IDLE: answer the batch's requests; True when the
        next batch is to be planned at once (inline batches back to back, ``CHAIN_S``)."""
        self._batch = _NO_BATCH
        self.pace.answered_rows, self.pace.answered_at = execution.rows, execution.finished
        run_s = execution.finished - execution.started
        self.pace.run_times.add(execution.rows, run_s, inline=execution.inline)
        deliver(execution, self._sinks, self.limits.max_batch_size)
        self.pace.backlogged = bool(self._queue)
        if not self._queue:
            self._enter(Phase.IDLE)
        elif self._holding():
            self._enter(Phase.HELD)
        elif execution.inline and time.monotonic() < self.pace.chain_until:
            self._enter(Phase.PLANNING)
            return True
        else:
            self._plan_soon()
        return False

    def load(self) -> Load:
        running = self._batch
        return Load(
            self._queue.rows,
            self._queue.rows + running.rows,
            len(self._queue) + len(running.tickets),
        )

    # ------------------------------------------------------------------ deadlines

    def _expire(self) -> None:
        """Answer 504 to every request whose deadline passed, then wait for the next one."""
        now = time.monotonic()
        for ticket in self._queue.expire(now):
            settle(ticket, DeadlineExceeded(NOT_RUN))
        self._batch.answer_late(now)
        in_flight = (*self._queue, *self._batch.tickets)
        waiting = [t.prepared.deadline for t in in_flight if not t.future.done()]
        if waiting:
            assert self._loop is not None
            self._deadlines.watch(self._loop, min(waiting))

    # ------------------------------------------------------------------ health and stop

    def stuck_for(self, now: float) -> float:
        return now - self._batch.started if self.phase is Phase.RUNNING else 0.0

    @property
    def alive(self) -> bool:
        return self.life is not Life.STOPPED

    def describe(self) -> dict[str, Any]:
        return _described(self)

    async def stop(self) -> None:
        if self.life is not Life.STOPPED:
            self.life = Life.STOPPING
        if self.phase is Phase.HELD:
            self._after_hold()
        elif self.phase in (Phase.WAITING, Phase.GATHERING):  # stopping waits for no company
            self._plan_call.cancel()
            self._plan_soon()
        if self.life is Life.STOPPING and (self._queue or self.phase is Phase.RUNNING):
            await self._stopped.wait()
        self.life = Life.STOPPED
        self._deadlines.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True)


def _refusal(
    scheduler: DynamicBatchScheduler,
    refused: Refused,
    rows: tuple[int, int, int],
    row_s: float,
    deadline: float,
) -> RLServeError:
    """The error that refuses a request: ``rows`` are the rows queued, running and asked."""
    name, (queued, running, asked) = scheduler.name, rows
    if refused is Refused.STOPPED:
        return ServiceUnavailable(
            f"model {name!r} is not running: the server is starting or shutting down"
        )
    if refused is Refused.FULL:
        return QueueFull(
            f"model {name!r}: queue full ({queued} of {scheduler.max_queue_rows} "
            "rows waiting); retry shortly",
            retry_after_s=max(1, math.ceil(queued * row_s)),
        )
    ahead = queued + running
    wait_s = admission_wait_s(ahead, asked, row_s)
    budget_s = max(deadline - time.monotonic(), 0.0)
    return QueueFull(
        f"model {name!r}: the {ahead} rows ahead would take about "
        f"{wait_s * 1000:.0f} ms to serve, longer than the {budget_s * 1000:.0f} "
        "ms left before this request's deadline; retry later",
        retry_after_s=math.ceil(wait_s - budget_s),
    )


def _waiting(window: list[Ticket], active: int) -> list[Waiting]:
    """What the batching rules know of the window's requests (unpinned: the active version)."""
    return [
        Waiting(
            t.prepared.rows,
            t.enqueued_at,
            t.prepared.deadline,
            active if t.version is None else t.version,
        )
        for t in window
    ]


def _described(scheduler: DynamicBatchScheduler) -> dict[str, Any]:
    limits, run_times, drain = scheduler.limits, scheduler.pace.run_times, scheduler.pace.drain
    return {
        "scheduler": "dynamic_batcher",
        "max_batch_size": limits.max_batch_size,
        "max_wait_ms": limits.max_wait_s * 1000,
        "max_queue_rows": scheduler.max_queue_rows,
        "inline_max_ms": run_times.inline_below_s * 1000,
        "expected_batch_ms": round(run_times.expected_s * 1000, 4),
        "drain_ms_per_row": round(drain.seconds_per_row * 1000, 5),
        "runs_inline": {
            f"{rows} rows": run_times.inline(rows) for rows in buckets_for(limits.max_batch_size)
        },
    }
