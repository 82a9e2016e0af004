"""The continuous-batching scheduler's part on the event loop: admission into the queue,
the requests in flight with the stream or future each answers to, the deadline sweep, and
the delivery of what the decoding thread hands over.

Deadlines: one timer per scheduler, set for the earliest deadline in flight: a request
still queued (or left in the queue's expired part by a step boundary) is answered 504 and
never runs; a running one is answered 504 and leaves the batch at the next step. A client
that goes away is answered 503 and leaves the same way. Everything here runs on the event
loop; it meets the decoding thread at the :class:`~serve.lm.scheduling.handover.Handover`
alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from dataclasses import dataclass

from kernel.errors import DeadlineExceeded, QueueFull, RLServeError, ServiceUnavailable
from serve.dataplane.scheduler import NOT_RUN
from serve.lm.messages import Generation, GenerationResult, ScoreResult, Scoring, TokenEvent
from serve.lm.scheduling.generation_record import GenerationSink, StepRecord
from serve.lm.scheduling.generation_stream import GenerationStream
from serve.lm.scheduling.handover import Handed, Handover, Refusal, Request, Started
from serve.lm.scheduling.state import SchedulerState

__all__ = ["LoopSide"]

log = logging.getLogger("rlserve.generation")


@dataclass(frozen=True, slots=True)
class _Pending:
    """A request in flight, as the loop answers it: a generation's stream or a scoring's
    future."""

    request: Request
    stream: GenerationStream | None
    future: asyncio.Future[ScoreResult] | None


class LoopSide:
    def __init__(
        self, name: str, handover: Handover, max_queue: int, sink: GenerationSink | None
    ) -> None:
        self.name = name
        self.max_queue = max_queue
        self._handover = handover
        self._sink = sink
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self._in_flight: dict[int, _Pending] = {}  # admitted and not answered, by id
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self._seconds_per_request = 0.0  # measured: time between answers while busy
        self._last_answer_at: float | None = None
        self._stopped = asyncio.Event()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._handover.start(self._wake)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    # ------------------------------------------------------------------ admission

    def submit_generation(
        self, generation: Generation, version: int | None, *, tokens: bool
    ) -> GenerationStream:
        self.admit(1)
        assert self._loop is not None
        request = Request.of(next(self._ids), generation, version, streamed=tokens)
        stream = GenerationStream(self._loop, lambda: self._cancel(request.id), tokens=tokens)
        self._enqueue(_Pending(request, stream, None))
        return stream

    def submit_scoring(self, scoring: Scoring, version: int | None) -> asyncio.Future[ScoreResult]:
        self.admit(1)
        assert self._loop is not None
        future: asyncio.Future[ScoreResult] = self._loop.create_future()
        request = Request.of(next(self._ids), scoring, version, streamed=False)
        self._enqueue(_Pending(request, None, future))
        return future

    def admit(self, requests: int) -> None:
        refusal = self._handover.refusal(requests, self.max_queue)
        if refusal is Refusal.STOPPED:
            raise ServiceUnavailable(
                f"model {self.name!r} is not running: the server is starting or shutting down"
            )
        if refusal is Refusal.FULL:
            waiting = self._handover.queued
            raise QueueFull(
                f"model {self.name!r}: queue full ({waiting} of {self.max_queue} requests "
                "waiting to decode); retry shortly",
                retry_after_s=max(1, math.ceil(waiting * self._seconds_per_request)),
            )

    def would_admit(self, requests: int) -> bool:
        return self._handover.refusal(requests, self.max_queue) is None

    def _enqueue(self, pending: _Pending) -> None:
        request = pending.request
        self._in_flight[request.id] = pending
        self._handover.put(request)
        if request.waiting.deadline < self._sweep_at:
            self._arm_sweep(request.waiting.deadline)

    def _cancel(self, id: int) -> None:
        """The caller gave up: answer nothing more; it leaves the queue or batch."""
        if id in self._in_flight:
            self._settle(id, ServiceUnavailable("the client went away"))
            self._handover.withdraw((id,))

    # ------------------------------------------------------------------ what the thread hands

    def _wake(self) -> None:
        """Called by the decoding thread: take what it handed, on the loop."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to answer
            self._loop.call_soon_threadsafe(self._take)

    def _take(self) -> None:
        handed, state = self._handover.take()
        for handover in handed:
            self._deliver(handover)
        if state is SchedulerState.STOPPED:  # the thread ended
            self._stopped.set()

    def _deliver(self, handed: Handed) -> None:
        in_flight = self._in_flight
        for id, outcome in handed.outcomes:
            pending = in_flight.get(id)
            if pending is None:  # answered already: cancelled, or past its deadline
                continue
            if isinstance(outcome, TokenEvent):
                if pending.stream is not None:
                    pending.stream.push(outcome)
            elif isinstance(outcome, Started):
                if pending.stream is not None:
                    pending.stream.started(outcome.version, outcome.sha256)
            else:
                self._settle(id, outcome)
        if handed.record is not None:
            self._record_step(handed.record)

    def _record_step(self, record: StepRecord) -> None:
        if record.answered:
            now = time.monotonic()
            if self._last_answer_at is not None and self._handover.status.sequences:
                sample = (now - self._last_answer_at) / len(record.answered)
                previous = self._seconds_per_request
                self._seconds_per_request = (
                    sample if not previous else 0.8 * previous + 0.2 * sample
                )
            self._last_answer_at = now
        if self._sink is not None:
            try:
                self._sink.accept_step(record)
            except Exception:
                log.exception("the generation metrics failed on a step of %s", self.name)

    def _settle(self, id: int, outcome: GenerationResult | ScoreResult | RLServeError) -> None:
        pending = self._in_flight.pop(id, None)
        if pending is None:
            return
        if pending.stream is not None:
            if isinstance(outcome, RLServeError):
                pending.stream.fail(outcome)
            elif isinstance(outcome, GenerationResult):
                pending.stream.finish(outcome)
        elif pending.future is not None and not pending.future.done():
            if isinstance(outcome, RLServeError):
                pending.future.set_exception(outcome)
            elif isinstance(outcome, ScoreResult):
                pending.future.set_result(outcome)

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
        due = [id for id, p in self._in_flight.items() if p.request.waiting.deadline <= now]
        never_ran = self._handover.withdraw(due) if due else set()
        for id in due:
            if id in never_ran:
                self._settle(id, DeadlineExceeded(NOT_RUN))
                continue
            spec = self._in_flight[id].request.work.spec
            budget_ms = (spec.deadline - spec.received_at) * 1000
            self._settle(
                id, DeadlineExceeded(f"no answer within the request's deadline of {budget_ms:g} ms")
            )
        if self._in_flight:
            self._arm_sweep(min(p.request.waiting.deadline for p in self._in_flight.values()))

    # ------------------------------------------------------------------ stop

    async def stopped(self) -> None:
        """Once the decoding thread said it has ended."""
        await self._stopped.wait()

    def close(self) -> None:
        """After the thread ended: answer what the queue left past its deadline, and stop
        the sweep."""
        self._expire()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep, self._sweep_at = None, math.inf
