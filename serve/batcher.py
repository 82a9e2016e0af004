"""The dynamic batcher: one per loaded model version.

Requests are admitted into a bounded queue (counted in rows), a loop asks
``serve.batching.plan`` what to do, answers expired requests with 504 without running
them, and runs released batches on a dedicated thread so the event loop keeps accepting.
One batch runs at a time per version; the next one forms while it runs.
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

from serve.batching import Plan, Policy, Waiting, buckets_for, plan
from serve.config import ModelSettings
from serve.errors import DeadlineExceeded, QueueFull, RLServeError, one_line
from serve.metrics import VersionMetrics
from serve.model import ServedModel
from serve.types import Answer, Outputs, Prepared

log = logging.getLogger("rlserve.batcher")

Run = Outputs | Exception  # what executing a group of requests produced


@dataclass(eq=False)
class Ticket:
    prepared: Prepared
    waiting: Waiting
    future: asyncio.Future[Answer] = field(repr=False)


class Batcher:
    def __init__(self, model: ServedModel, settings: ModelSettings, metrics: VersionMetrics):
        self.model = model
        self.policy = Policy(
            settings.max_batch_size,
            settings.max_wait_ms / 1000,
            buckets_for(settings.max_batch_size),
        )
        self._flush = dataclasses.replace(self.policy, max_wait_s=0.0)
        self.max_queue_rows = settings.max_queue_rows
        self._metrics = metrics
        self._queue: deque[Ticket] = deque()
        self._queued_rows = 0
        self._arrival = asyncio.Event()
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix=f"batch-{model.name}-{model.version}"
        )
        self._expected_run_s = 0.0  # moving average of batch run time
        self._running_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    # ------------------------------------------------------------------ admission

    def submit(self, prepared: Prepared, deadline: float) -> asyncio.Future[Answer]:
        """Queue a request; raises QueueFull (429) when its rows do not fit."""
        if self._queued_rows + prepared.rows > self.max_queue_rows:
            raise QueueFull(
                f"model {self.model.name!r} version {self.model.version}: queue full "
                f"({self._queued_rows} of {self.max_queue_rows} rows waiting); retry shortly",
                retry_after_s=self._retry_after_s(),
            )
        now = time.monotonic()
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._queue.append(Ticket(prepared, Waiting(prepared.rows, now, deadline), future))
        self._add_queued(prepared.rows)
        self._arrival.set()
        return future

    def _retry_after_s(self) -> int:
        batches = self._queued_rows / self.policy.max_batch_size
        return max(1, math.ceil(batches * max(self._expected_run_s, 0.001)))

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"batcher-{self.model.name}")

    async def _loop(self) -> None:
        while not (self._closing and not self._queue):
            if not self._queue:
                await self._wait_for_arrival(None)
                continue
            policy = self._flush if self._closing else self.policy  # stopping: no more waiting
            decision = plan(self._waiting(), time.monotonic(), policy, self._expected_run_s)
            self._expire(decision)
            if decision.take:
                await self._execute(decision)
            elif decision.wait_s > 0:
                await self._wait_for_arrival(decision.wait_s)

    def _waiting(self) -> list[Waiting]:
        return [t.waiting for t in self._queue]

    async def _wait_for_arrival(self, timeout: float | None) -> None:
        self._arrival.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrival.wait(), timeout)

    def _expire(self, decision: Plan) -> None:
        for ticket in self._pop(decision.expired):
            _settle(
                ticket, DeadlineExceeded("deadline passed while queued; the request was not run")
            )

    async def _execute(self, decision: Plan) -> None:
        tickets = self._pop(decision.take)
        started = time.monotonic()
        rows = sum(t.prepared.rows for t in tickets)
        self._running_since = started
        for t in tickets:
            self._metrics.queue_wait.observe(started - t.waiting.enqueued_at)
        self._metrics.pending_rows.inc(rows)
        batch = [t.prepared for t in tickets]
        try:
            runs = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._run, batch, decision.padded_rows
            )
        finally:
            self._running_since = None
            self._metrics.pending_rows.dec(rows)
        self._record(time.monotonic() - started, rows)
        answers = [a for group, outputs in runs for a in self._answers(group, outputs)]
        for ticket, answer in zip(tickets, answers, strict=True):
            _settle(ticket, answer)

    def _run(self, batch: list[Prepared], padded_rows: int) -> list[tuple[list[Prepared], Run]]:
        """On the batch thread: run the batch; if it fails, run each request alone so that
        only the request that breaks the model fails."""
        try:
            return [(batch, self.model.execute(batch, padded_rows))]
        except Exception as exc:
            if len(batch) == 1:
                return [(batch, exc)]
        return [([one], self._run([one], one.rows)[0][1]) for one in batch]

    def _answers(self, group: list[Prepared], outputs: Run) -> list[Answer | RLServeError]:
        if isinstance(outputs, Exception):
            log.error("model %s failed on a request: %s", self.model.name, one_line(outputs))
            error = RLServeError(
                f"model {self.model.name!r} failed on this input: {one_line(outputs)}"
            )
            return [error] * len(group)
        try:
            return self.model.answer(group, outputs)
        except Exception as exc:  # a bug in answer(): the requests of this group learn of it
            log.exception("answering a batch of %s failed", self.model.name)
            return [RLServeError(f"internal error: {type(exc).__name__}")] * len(group)

    def _record(self, run_s: float, rows: int) -> None:
        self._expected_run_s = (
            0.8 * self._expected_run_s + 0.2 * run_s if self._expected_run_s else run_s
        )
        m = self._metrics
        m.inference_latency.observe(run_s)
        m.batch_rows.observe(rows)
        m.batch_fill.observe(rows / self.policy.max_batch_size)

    def _pop(self, indices: tuple[int, ...]) -> list[Ticket]:
        if not indices:
            return []
        chosen = set(indices)
        taken = [t for i, t in enumerate(self._queue) if i in chosen]
        self._queue = deque(t for i, t in enumerate(self._queue) if i not in chosen)
        self._add_queued(-sum(t.prepared.rows for t in taken))
        return taken

    def _add_queued(self, rows: int) -> None:
        self._queued_rows += rows
        self._metrics.queue_rows.inc(rows)
        self._metrics.pending_rows.inc(rows)

    # ------------------------------------------------------------------ health and stop

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def stuck_for(self, now: float) -> float:
        """Seconds the current batch has been running (0 when idle)."""
        return 0.0 if self._running_since is None else now - self._running_since

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Finish what is queued (expired requests still get their 504), then stop."""
        self._closing = True
        self._arrival.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)


def _settle(ticket: Ticket, answer: Answer | RLServeError) -> None:
    if ticket.future.done():  # the client gave up (deadline, disconnect)
        return
    if isinstance(answer, RLServeError):
        ticket.future.set_exception(answer)
    else:
        ticket.future.set_result(answer)
