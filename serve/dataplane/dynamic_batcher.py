"""The dynamic batch scheduler: one per model, work-conserving.

Requests are admitted into a bounded queue (counted in rows), and only while the rows ahead
of them can be served within their deadline at the measured pace (``batching.
admission_wait_s``): under overload the excess is refused at once with 429, so admitted
requests are answered in time instead of everyone timing out. A request larger than
``max_batch_size`` is cut into parts pinned to one version (``serve.dataplane.split``).

Whenever the model is idle and something changed, ``_flush`` asks
``serve.dataplane.batching.plan`` what to do with the head of the queue and does it: a
request that finds the model idle runs at once, together with whatever arrived in the same
turn of the event loop; rows that arrive while a batch runs form the next batch, released
when the running one ends. One batch runs at a time per model.

A batch runs inline on the event loop while batches are cheap, on the scheduler's thread
when they are not (``batching.RunTimes``, from measured run times). While a backlog waits,
inline batches follow each other for up to ``CHAIN_S`` before the loop takes its turn. A
batch's outputs become one :class:`~serve.dataplane.record.BatchRecord`, handed to every
record sink (metrics, and whatever a deployment adds), and each request's answer is cut
from it.

Deadlines are kept by one timer per scheduler, set for the earliest deadline in flight: a
request still queued when its deadline passes is answered 504 and never runs; one whose
batch is still running is answered 504 at its deadline.

Each request runs on the version it names, or else on the version that is active when its
batch forms; every answer is stamped with the version that computed it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from serve.config import ModelSettings
from serve.dataplane import split
from serve.dataplane.batching import (
    BatchLimits,
    DrainRate,
    RunTimes,
    Waiting,
    admission_wait_s,
    buckets_for,
    plan,
)
from serve.dataplane.messages import InferenceResponse, Prepared
from serve.dataplane.model import ServedModel, VersionSource
from serve.dataplane.record import BatchRecord, RecordSink
from serve.dataplane.scheduler import NOT_RUN, Load
from serve.errors import (
    DeadlineExceeded,
    InvalidInput,
    QueueFull,
    RLServeError,
    ServiceUnavailable,
    one_line,
)
from serve.types import Outputs

log = logging.getLogger("rlserve.scheduler")

# Inline batches run back to back, without a turn of the event loop in between, for this
# long while rows wait: under a backlog each turn of the loop serves several batches, so
# the work of reading (and refusing) requests is shared by more answered rows.
CHAIN_S = 0.002


class _Refused(Enum):
    """Why a request is not admitted."""

    STOPPED = "stopped"  # starting or shutting down
    FULL = "full"  # max_queue_rows reached
    LATE = "late"  # the rows ahead would make it miss its deadline


@dataclass(slots=True, eq=False)
class Ticket:
    prepared: Prepared
    enqueued_at: float
    version: int | None  # pinned; None runs on whichever version is active at batch time
    future: asyncio.Future[InferenceResponse] = field(repr=False)


@dataclass(frozen=True, slots=True)
class _Run:
    """What executing a group of requests produced: outputs, or the exception it raised."""

    requests: list[Ticket]
    inputs: dict[str, np.ndarray]  # every row, unpadded
    outputs: Outputs | Exception


@dataclass(frozen=True, slots=True)
class _Execution:
    """A batch's runs and how long they took, measured on the thread that ran them."""

    runs: list[_Run]
    rows: int
    started: float  # monotonic seconds
    finished: float
    inline: bool  # it ran on the event loop


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
        self.limits = BatchLimits(settings.max_batch_size, settings.max_wait_ms / 1000)
        self._no_wait = dataclasses.replace(self.limits, max_wait_s=0.0)
        self.max_queue_rows = settings.max_queue_rows
        self.run_times = RunTimes(settings.inline_max_ms / 1000)
        self.drain = DrainRate()
        self.held = False
        self._sinks = tuple(sinks)
        self._queue: deque[Ticket] = deque()
        self._queued_rows = 0
        self._running: list[Ticket] = []  # the batch being executed
        self._running_rows = 0
        self._running_since: float | None = None
        self._backlogged = False  # rows were waiting when the last batch ended
        self._chain_until = 0.0  # inline batches may follow each other until then
        self._flush_at: asyncio.TimerHandle | asyncio.Handle | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._idle = asyncio.Event()

    # ------------------------------------------------------------------ admission

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

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

    def admit(self, rows: int, deadline: float) -> None:
        """Refuse now what cannot be served: the queue is full, or the rows ahead would
        take longer than the deadline allows (raises QueueFull, ServiceUnavailable)."""
        refused = self._refused(rows, deadline)
        if refused is None:
            return
        if refused is _Refused.STOPPED:
            raise ServiceUnavailable(
                f"model {self.name!r} is not running: the server is starting or shutting down"
            )
        if refused is _Refused.FULL:
            raise QueueFull(
                f"model {self.name!r}: queue full ({self._queued_rows} of {self.max_queue_rows} "
                "rows waiting); retry shortly",
                retry_after_s=self._retry_after_s(self._queued_rows),
            )
        ahead = self._queued_rows + self._running_rows
        wait_s = admission_wait_s(ahead, rows, self._row_s())
        budget_s = max(deadline - time.monotonic(), 0.0)
        raise QueueFull(
            f"model {self.name!r}: the {ahead} rows ahead would take about "
            f"{wait_s * 1000:.0f} ms to serve, longer than the {budget_s * 1000:.0f} "
            "ms left before this request's deadline; retry later",
            retry_after_s=math.ceil(wait_s - budget_s),
        )

    def would_admit(self, rows: int, deadline: float) -> bool:
        """``admit``'s decision alone, without building an error: the cheap question a
        frontend asks for every call while the process is overloaded."""
        return self._refused(rows, deadline) is None

    def _refused(self, rows: int, deadline: float) -> _Refused | None:
        """Why ``rows`` rows due by ``deadline`` cannot be admitted now (None: they can)."""
        if self._closing or self._loop is None:
            return _Refused.STOPPED
        if self._queued_rows + rows > self.max_queue_rows:
            return _Refused.FULL
        if self.held:
            return None  # requests wait for the resume, within their deadlines
        ahead = self._queued_rows + self._running_rows
        if admission_wait_s(ahead, rows, self._row_s()) > deadline - time.monotonic():
            return _Refused.LATE
        return None

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
        ticket = Ticket(prepared, time.monotonic(), version, future)
        self._queue.append(ticket)
        self._queued_rows += prepared.rows
        if ticket.prepared.deadline < self._sweep_at:
            self._arm_sweep(ticket.prepared.deadline)
        self._wake()
        return future

    def _row_s(self) -> float:
        """Seconds per row at the measured drain rate (or the batches' run time)."""
        return self.drain.per_row(self.run_times.expected_s / self.limits.max_batch_size)

    def _retry_after_s(self, rows: int) -> int:
        """Whole seconds until ``rows`` queued rows are served at the measured rate."""
        return max(1, math.ceil(rows * self._row_s()))

    # ------------------------------------------------------------------ control

    def pin_queued(self, version: int) -> None:
        for ticket in self._queue:
            if ticket.version is None:
                ticket.version = version

    def pinned_versions(self) -> set[int]:
        return {t.version for t in self._queue if t.version is not None}

    def hold(self) -> None:
        self.held = True

    def resume(self) -> None:
        self.held = False
        self._wake()

    # ------------------------------------------------------------------ forming batches

    def _wake(self) -> None:
        """Plan again soon: in this turn of the event loop, after the requests that arrived
        with this one have joined the queue. A pending max-wait timer stands unless the
        queue already holds a full batch."""
        if self._running or self._loop is None:
            return  # the running batch plans the next one when it ends
        pending = self._flush_at
        if pending is not None:
            waiting_for_more = isinstance(pending, asyncio.TimerHandle)
            if not waiting_for_more or self._queued_rows < self.limits.max_batch_size:
                return
            pending.cancel()
        self._flush_at = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._flush_at is not None:  # called by the event loop, not by a chain
            self._chain_until = time.monotonic() + CHAIN_S
        self._flush_at = None
        if self._running or (self.held and not self._closing):
            return
        self._drop_settled()
        window = self._window()
        if window:
            self._plan(window)
        if self._closing and not self._queue and not self._running:
            self._idle.set()

    def _window(self) -> list[Ticket]:
        """The head of the queue: every request that could join the next batch, and one more."""
        window: list[Ticket] = []
        rows = 0
        for ticket in self._queue:
            window.append(ticket)
            rows += ticket.prepared.rows
            if rows > self.limits.max_batch_size:
                break
        return window

    def _plan(self, window: list[Ticket]) -> None:
        assert self._loop is not None
        active = self.versions.active or 0
        waiting = [
            Waiting(
                t.prepared.rows,
                t.enqueued_at,
                t.prepared.deadline,
                active if t.version is None else t.version,
            )
            for t in window
        ]
        limits = self._no_wait if self._closing else self.limits
        decision = plan(waiting, time.monotonic(), limits, self.run_times.expected_s)
        expired, batch = self._pop(window, decision.expired, decision.take)
        for ticket in expired:
            _settle(ticket, DeadlineExceeded(NOT_RUN))
        if batch:
            self._run(batch, waiting[decision.take[0]].version)
        elif decision.wait_s > 0:
            self._flush_at = self._loop.call_later(decision.wait_s, self._flush)
        elif self._queue:
            self._flush_at = self._loop.call_soon(self._flush)  # only expired ones went

    def _pop(
        self, window: list[Ticket], expired: tuple[int, ...], take: tuple[int, ...]
    ) -> tuple[list[Ticket], list[Ticket]]:
        """Remove these window positions from the head of the queue."""
        chosen = {*expired, *take}
        kept = [t for i, t in enumerate(window) if i not in chosen]
        for _ in window:
            self._queue.popleft()
        self._queue.extendleft(reversed(kept))
        popped = ([window[i] for i in expired], [window[i] for i in take])
        self._queued_rows -= sum(t.prepared.rows for group in popped for t in group)
        return popped

    def _drop_settled(self) -> None:
        """Forget queued requests whose caller already has an answer (their deadline)."""
        while self._queue and self._queue[0].future.done():
            self._queued_rows -= self._queue.popleft().prepared.rows

    # ------------------------------------------------------------------ running batches

    def _run(self, batch: list[Ticket], version: int) -> None:
        assert self._loop is not None
        model = self.versions.get(version)
        if model is None:
            gone = ServiceUnavailable(f"model {self.name!r} version {version} was unloaded")
            for ticket in batch:
                _settle(ticket, gone)
            self._wake()
            return
        self._running = batch
        self._running_since = time.monotonic()
        rows = self._running_rows = sum(t.prepared.rows for t in batch)
        self.drain.started(self._running_since, rows, backlogged=self._backlogged)
        if self.run_times.next_inline(rows):
            self._finish(model, _execute(model, batch, rows, inline=True))
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"batch-{self.name}")
        running = self._loop.run_in_executor(self._executor, _execute, model, batch, rows, False)

        def finished(done: asyncio.Future[_Execution]) -> None:
            if done.cancelled() or done.exception() is not None:
                now = time.monotonic()
                lost = _Run(batch, {}, RuntimeError("the batch thread stopped"))
                self._finish(model, _Execution([lost], rows, now, now, inline=False))
            else:
                self._finish(model, done.result())

        running.add_done_callback(finished)

    def _finish(self, model: ServedModel, execution: _Execution) -> None:
        self._running, self._running_rows = [], 0
        self._running_since = None
        run_s = execution.finished - execution.started
        self.run_times.add(execution.rows, run_s, inline=execution.inline)
        for run in execution.runs:
            if isinstance(run.outputs, Exception):
                _fail(model, run.requests, run.outputs)
                continue
            span = (execution.started, execution.finished)
            record = _record(model, run, run.outputs, span, self.limits.max_batch_size)
            self._answer(model, record, run.requests)
            self._publish(record)
        self._backlogged = bool(self._queue)
        if self._queue and execution.inline and time.monotonic() < self._chain_until:
            self._flush()  # cheap batches back to back while a backlog waits (CHAIN_S)
        elif self._queue:
            self._wake()
        elif self._closing:
            self._idle.set()

    def _answer(self, model: ServedModel, record: BatchRecord, tickets: list[Ticket]) -> None:
        for ticket, start in zip(tickets, record.offsets, strict=False):
            try:
                outputs = model.respond(ticket.prepared, record.outputs, start)
            except Exception as exc:  # a bug in respond(): this request learns of it
                log.exception("answering a request of %s failed", self.name)
                _settle(ticket, RLServeError(f"internal error: {type(exc).__name__}"))
                continue
            response = InferenceResponse(
                model.name, model.version, model.sha256, outputs, ticket.prepared.single
            )
            _settle(ticket, response)

    def _publish(self, record: BatchRecord) -> None:
        for sink in self._sinks:
            try:
                sink.accept(record)
            except Exception:
                log.exception("record sink %s failed on a batch of %s", sink, self.name)

    def load(self) -> Load:
        running_rows = sum(t.prepared.rows for t in self._running)
        return Load(
            self._queued_rows,
            self._queued_rows + running_rows,
            len(self._queue) + len(self._running),
        )

    # ------------------------------------------------------------------ deadlines

    def _arm_sweep(self, at: float) -> None:
        assert self._loop is not None
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = at
        self._sweep = self._loop.call_later(max(0.0, at - time.monotonic()), self._expire)

    def _expire(self) -> None:
        """Answer 504 to every request whose deadline passed, then wait for the next one."""
        self._sweep, self._sweep_at = None, math.inf
        now = time.monotonic()
        kept: deque[Ticket] = deque()
        for ticket in self._queue:
            if ticket.future.done():
                self._queued_rows -= ticket.prepared.rows
            elif ticket.prepared.deadline <= now:
                self._queued_rows -= ticket.prepared.rows
                _settle(ticket, DeadlineExceeded(NOT_RUN))
            else:
                kept.append(ticket)
        self._queue = kept
        for ticket in self._running:
            if ticket.prepared.deadline <= now:
                budget_ms = (ticket.prepared.deadline - ticket.prepared.received_at) * 1000
                _settle(
                    ticket,
                    DeadlineExceeded(
                        f"no answer within the request's deadline of {budget_ms:g} ms"
                    ),
                )
        waiting = [
            t.prepared.deadline for t in (*self._queue, *self._running) if not t.future.done()
        ]
        if waiting:
            self._arm_sweep(min(waiting))

    # ------------------------------------------------------------------ health and stop

    def stuck_for(self, now: float) -> float:
        return 0.0 if self._running_since is None else now - self._running_since

    @property
    def alive(self) -> bool:
        return not (self._closing and self._idle.is_set())

    def describe(self) -> dict[str, Any]:
        return {
            "scheduler": "dynamic_batcher",
            "max_batch_size": self.limits.max_batch_size,
            "max_wait_ms": self.limits.max_wait_s * 1000,
            "max_queue_rows": self.max_queue_rows,
            "inline_max_ms": self.run_times.inline_below_s * 1000,
            "expected_batch_ms": round(self.run_times.expected_s * 1000, 4),
            "drain_ms_per_row": round(self.drain.seconds_per_row * 1000, 5),
            "runs_inline": {
                f"{rows} rows": self.run_times.inline(rows)
                for rows in buckets_for(self.limits.max_batch_size)
            },
        }

    async def stop(self) -> None:
        self._closing = True
        if self._queue or self._running:
            self._idle.clear()
            self._wake()
            await self._idle.wait()
        self._idle.set()
        if self._sweep is not None:
            self._sweep.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True)


def _execute(model: ServedModel, batch: list[Ticket], rows: int, inline: bool) -> _Execution:
    started = time.monotonic()
    runs = _runs(model, batch)
    return _Execution(runs, rows, started, time.monotonic(), inline)


def _runs(model: ServedModel, batch: list[Ticket]) -> list[_Run]:
    """Run a batch; if it fails, run each request alone so that only the request that
    breaks the model fails."""
    requests = [t.prepared for t in batch]
    inputs = _stacked(requests)
    try:
        return [_Run(batch, inputs, model.execute(inputs, requests))]
    except Exception as exc:
        if len(batch) == 1:
            return [_Run(batch, inputs, exc)]
    return [run for one in batch for run in _runs(model, [one])]


def _stacked(requests: list[Prepared]) -> dict[str, np.ndarray]:
    """Every request's rows, one array per input (no copy for a request alone)."""
    if len(requests) == 1:
        return requests[0].feeds
    return {name: np.concatenate([p.feeds[name] for p in requests]) for name in requests[0].feeds}


def _record(
    model: ServedModel,
    run: _Run,
    outputs: Outputs,
    span: tuple[float, float],
    max_rows: int,
) -> BatchRecord:
    tickets = run.requests
    offsets = [0]
    for ticket in tickets:
        offsets.append(offsets[-1] + ticket.prepared.rows)
    return BatchRecord(
        model=model.name,
        version=model.version,
        sha256=model.sha256,
        request_ids=tuple(t.prepared.request_id for t in tickets),
        requests=tuple(t.prepared for t in tickets),
        offsets=tuple(offsets),
        inputs=run.inputs,
        outputs=outputs,
        received_at=tuple(t.prepared.received_at for t in tickets),
        enqueued_at=tuple(t.enqueued_at for t in tickets),
        started_at=span[0],
        finished_at=span[1],
        max_rows=max_rows,
    )


def _fail(model: ServedModel, tickets: list[Ticket], exc: Exception) -> None:
    log.error("model %s failed on a request: %s", model.name, one_line(exc))
    error = RLServeError(f"model {model.name!r} failed on this input: {one_line(exc)}")
    for ticket in tickets:
        _settle(ticket, error)


def _settle(ticket: Ticket, outcome: InferenceResponse | RLServeError) -> None:
    if ticket.future.done():  # already answered: its deadline passed
        return
    if isinstance(outcome, RLServeError):
        ticket.future.set_exception(outcome)
    else:
        ticket.future.set_result(outcome)
