"""The dynamic batcher: one per model.

Requests are admitted into a bounded queue (counted in rows). A loop asks
``serve.dataplane.batching.plan`` what to do, answers expired requests with 504 without running
them, and runs released batches on a dedicated thread so the event loop keeps accepting.
One batch runs at a time per model; the next one forms while it runs.

Each request runs on the version it names, or else on the version that is active when its
batch forms (``serve.control.versions``); every answer is stamped with the version that computed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from serve.config import ModelSettings
from serve.control.versions import VersionTable
from serve.dataplane.batching import Policy, Waiting, buckets_for, plan
from serve.dataplane.model import ServedModel
from serve.errors import DeadlineExceeded, QueueFull, RLServeError, ServiceUnavailable, one_line
from serve.metrics import Metrics, VersionMetrics
from serve.types import Answer, Outputs, Prepared

log = logging.getLogger("rlserve.batcher")

Run = Outputs | Exception  # what executing a group of requests produced


@dataclass(frozen=True)
class Stamped:
    """An answer and the model version that computed it."""

    answer: Answer
    version: int
    sha256: str


@dataclass(eq=False)
class Ticket:
    prepared: Prepared
    enqueued_at: float
    deadline: float
    version: int | None  # pinned; None runs on whichever version is active at batch time
    future: asyncio.Future[Stamped] = field(repr=False)


class Batcher:
    def __init__(
        self, name: str, versions: VersionTable, settings: ModelSettings, metrics: Metrics
    ) -> None:
        self.name = name
        self.versions = versions
        self.policy = Policy(
            settings.max_batch_size,
            settings.max_wait_ms / 1000,
            buckets_for(settings.max_batch_size),
        )
        self._flush = dataclasses.replace(self.policy, max_wait_s=0.0)
        self.max_queue_rows = settings.max_queue_rows
        self._metrics = metrics
        self._per_version: dict[int, VersionMetrics] = {}
        self._queue: deque[Ticket] = deque()
        self._queued_rows = 0
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"batch-{name}")
        self._expected_run_s = 0.0  # moving average of batch run time
        self._running_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.held = False

    # ------------------------------------------------------------------ admission

    def submit(
        self, prepared: Prepared, deadline: float, version: int | None = None
    ) -> asyncio.Future[Stamped]:
        """Queue a request; raises QueueFull (429) when its rows do not fit."""
        if self._closing:
            raise ServiceUnavailable(
                f"model {self.name!r} has stopped: the server is shutting down"
            )
        if self._queued_rows + prepared.rows > self.max_queue_rows:
            raise QueueFull(
                f"model {self.name!r}: queue full ({self._queued_rows} of {self.max_queue_rows} "
                "rows waiting); retry shortly",
                retry_after_s=self._retry_after_s(),
            )
        future: asyncio.Future[Stamped] = asyncio.get_running_loop().create_future()
        self._queue.append(Ticket(prepared, time.monotonic(), deadline, version, future))
        self._add_queued(prepared.rows)
        self._wakeup.set()
        return future

    def _retry_after_s(self) -> int:
        batches = self._queued_rows / self.policy.max_batch_size
        return max(1, math.ceil(batches * max(self._expected_run_s, 0.001)))

    # ------------------------------------------------------------------ control

    def pin_queued(self, version: int) -> None:
        """Requests already queued without a version stay on ``version`` (a draining swap)."""
        for ticket in self._queue:
            if ticket.version is None:
                ticket.version = version

    def pinned_versions(self) -> set[int]:
        """Versions that queued requests are pinned to: they must stay loaded."""
        return {t.version for t in self._queue if t.version is not None}

    def hold(self) -> None:
        """Form no batches until ``resume``; queued requests wait within their deadlines."""
        self.held = True

    def resume(self) -> None:
        self.held = False
        self._wakeup.set()

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.name}")

    async def _loop(self) -> None:
        while not (self._closing and not self._queue):
            if not self._queue:
                await self._sleep(None)
                continue
            held = self.held and not self._closing
            policy = self._flush if self._closing else self.policy  # stopping: no more waiting
            waiting = self._waiting()
            decision = plan(waiting, time.monotonic(), policy, self._expected_run_s)
            take = () if held else decision.take
            expired, batch = self._pop(decision.expired, take)
            for ticket in expired:
                _settle(
                    ticket,
                    DeadlineExceeded("deadline passed while queued; the request was not run"),
                )
            if batch:
                await self._execute(batch, waiting[take[0]].version, decision.padded_rows)
            elif held:
                await self._sleep(self._until_next_deadline())
            elif decision.wait_s > 0:
                await self._sleep(decision.wait_s)

    def _waiting(self) -> list[Waiting]:
        active = self.versions.active or 0
        return [
            Waiting(
                t.prepared.rows,
                t.enqueued_at,
                t.deadline,
                active if t.version is None else t.version,
            )
            for t in self._queue
        ]

    def _until_next_deadline(self) -> float | None:
        return (
            max(0.0, min(t.deadline for t in self._queue) - time.monotonic())
            if self._queue
            else None
        )

    async def _sleep(self, timeout: float | None) -> None:
        self._wakeup.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout)

    async def _execute(self, tickets: list[Ticket], version: int, padded_rows: int) -> None:
        model = self.versions.get(version)
        if model is None:
            unloaded = ServiceUnavailable(f"model {self.name!r} version {version} was unloaded")
            for ticket in tickets:
                _settle(ticket, unloaded)
            return
        metrics = self._metrics_of(version)
        started = time.monotonic()
        rows = sum(t.prepared.rows for t in tickets)
        for t in tickets:
            metrics.queue_wait.observe(started - t.enqueued_at)
        runs = await self._run_off_loop(model, [t.prepared for t in tickets], padded_rows, rows)
        self._record(metrics, time.monotonic() - started, rows)
        answers = [a for group, outputs in runs for a in _answers(model, group, outputs)]
        for ticket, answer in zip(tickets, answers, strict=True):
            stamped = Stamped(answer, version, model.sha256) if isinstance(answer, dict) else answer
            _settle(ticket, stamped)

    async def _run_off_loop(
        self, model: ServedModel, batch: list[Prepared], padded_rows: int, rows: int
    ) -> list[tuple[list[Prepared], Run]]:
        self._running_since = time.monotonic()
        self._metrics.pending_rows.inc(rows)
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, _run, model, batch, padded_rows)
        finally:
            self._running_since = None
            self._metrics.pending_rows.dec(rows)

    def _metrics_of(self, version: int) -> VersionMetrics:
        if version not in self._per_version:
            self._per_version[version] = VersionMetrics.of(self._metrics, self.name, version)
        return self._per_version[version]

    def _record(self, metrics: VersionMetrics, run_s: float, rows: int) -> None:
        previous = self._expected_run_s
        self._expected_run_s = 0.8 * previous + 0.2 * run_s if previous else run_s
        metrics.inference_latency.observe(run_s)
        metrics.batch_rows.observe(rows)
        metrics.batch_fill.observe(rows / self.policy.max_batch_size)

    def _pop(self, *groups: tuple[int, ...]) -> list[list[Ticket]]:
        """Remove the tickets at these queue positions (all from one snapshot), per group."""
        queue = list(self._queue)
        popped = [[queue[i] for i in group] for group in groups]
        chosen = {i for group in groups for i in group}
        if chosen:
            self._queue = deque(t for i, t in enumerate(queue) if i not in chosen)
            self._add_queued(-sum(t.prepared.rows for group in popped for t in group))
        return popped

    def _add_queued(self, rows: int) -> None:
        self._queued_rows += rows
        self._metrics.queue_rows.labels(self.name).inc(rows)
        self._metrics.pending_rows.inc(rows)

    # ------------------------------------------------------------------ health and stop

    def stuck_for(self, now: float) -> float:
        """Seconds the current batch has been running (0 when idle)."""
        return 0.0 if self._running_since is None else now - self._running_since

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Finish what is queued (expired requests still get their 504), then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)


def _run(
    model: ServedModel, batch: list[Prepared], padded_rows: int
) -> list[tuple[list[Prepared], Run]]:
    """On the batch thread: run the batch; if it fails, run each request alone so that
    only the request that breaks the model fails."""
    try:
        return [(batch, model.execute(batch, padded_rows))]
    except Exception as exc:
        if len(batch) == 1:
            return [(batch, exc)]
    return [([one], _run(model, [one], one.rows)[0][1]) for one in batch]


def _answers(
    model: ServedModel, group: list[Prepared], outputs: Run
) -> list[Answer | RLServeError]:
    if isinstance(outputs, Exception):
        log.error("model %s failed on a request: %s", model.name, one_line(outputs))
        error = RLServeError(f"model {model.name!r} failed on this input: {one_line(outputs)}")
        return [error] * len(group)
    try:
        return model.answer(group, outputs)
    except Exception as exc:  # a bug in answer(): the requests of this group learn of it
        log.exception("answering a batch of %s failed", model.name)
        return [RLServeError(f"internal error: {type(exc).__name__}")] * len(group)


def _settle(ticket: Ticket, outcome: Stamped | RLServeError) -> None:
    if ticket.future.done():  # the client gave up (deadline, disconnect)
        return
    if isinstance(outcome, RLServeError):
        ticket.future.set_exception(outcome)
    else:
        ticket.future.set_result(outcome)
