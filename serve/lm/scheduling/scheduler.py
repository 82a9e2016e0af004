"""The continuous-batching scheduler: one per language model, decoding on its own thread.

Requests to generate and to score are admitted into a bounded queue (``max_queue_rows``
counts requests here; beyond it 429 with Retry-After). A decoding thread runs steps back
to back while there is work; at every step boundary the waiting requests that fit join
(``serve.lm.scheduling.step_plan``), so a request that arrives while others decode joins
at the next step, without waiting for them to finish. Each request's
:class:`~serve.lm.scheduling.generation_stream.GenerationStream` (or a scoring's future)
gets its tokens and answer on the event loop; the metrics get a
:class:`~serve.lm.scheduling.generation_record.StepRecord` of the steps.

The scheduler is two parts, each with its own state, joined by one
:class:`~serve.lm.scheduling.handover.Handover`:

- :class:`~serve.lm.scheduling.loop_side.LoopSide`, on the event loop: admission, the
  requests in flight, the deadline sweep, delivering what the thread hands over;
- :class:`~serve.lm.scheduling.decoding_thread.DecodingThread`: the step boundaries,
  prefill, decode and the key/value caches of every version's batch.

Its state (``serve.lm.scheduling.state``): hold runs no step until resume (queued and
running requests wait within their deadlines); stop refuses new requests and decodes
everything admitted to its end (or its deadline), then the thread ends.
"""

from __future__ import annotations

import asyncio
from typing import Any

from serve.config import ModelSettings
from serve.dataplane.model import VersionSource
from serve.dataplane.scheduler import Load
from serve.lm.messages import Generation, ScoreResult, Scoring
from serve.lm.scheduling.decoding_thread import DecodingThread
from serve.lm.scheduling.generation_record import GenerationSink
from serve.lm.scheduling.generation_stream import GenerationStream
from serve.lm.scheduling.handover import Handover
from serve.lm.scheduling.loop_side import LoopSide
from serve.lm.scheduling.state import Control, SchedulerState
from serve.lm.scheduling.step_plan import StepLimits

__all__ = ["ContinuousBatchScheduler"]


class ContinuousBatchScheduler:
    def __init__(
        self,
        name: str,
        versions: VersionSource,
        settings: ModelSettings,
        sink: GenerationSink | None = None,
    ) -> None:
        self.name = name
        self.limits = StepLimits(
            settings.max_sequences, settings.max_batch_tokens, settings.max_prefill_tokens
        )
        self.max_answer_tokens = settings.max_answer_tokens  # the frontends bound answers
        self._handover = Handover()
        self._loop_side = LoopSide(name, self._handover, settings.max_queue_rows, sink)
        self._decoding = DecodingThread(name, versions, self.limits, self._handover)

    def start(self) -> None:
        self._loop_side.start()
        self._decoding.start()

    # ------------------------------------------------------------------ admission

    def submit_generation(
        self, generation: Generation, version: int | None, *, tokens: bool
    ) -> GenerationStream:
        """Queue a generation prepared by a version (``version``: the one the caller named,
        None for whichever is active when it joins); ``tokens``: stream its token events."""
        return self._loop_side.submit_generation(generation, version, tokens=tokens)

    def submit_scoring(self, scoring: Scoring, version: int | None) -> asyncio.Future[ScoreResult]:
        return self._loop_side.submit_scoring(scoring, version)

    @property
    def max_queue_rows(self) -> int:
        """Requests the queue holds at most (a call of more could never be admitted)."""
        return self._loop_side.max_queue

    def admit(self, rows: int, deadline: float) -> None:
        self._loop_side.admit(rows)

    def would_admit(self, rows: int, deadline: float) -> bool:
        return self._loop_side.would_admit(rows)

    # ------------------------------------------------------------------ control

    @property
    def held(self) -> bool:
        return self._handover.state is SchedulerState.HELD

    def hold(self) -> None:
        self._handover.control(Control.HOLD)

    def resume(self) -> None:
        self._handover.control(Control.RESUME)

    def pin_queued(self, version: int) -> None:
        self._handover.pin_queued(version)

    def pinned_versions(self) -> set[int]:
        return self._handover.pinned_versions()

    # ------------------------------------------------------------------ health and stop

    def stuck_for(self, now: float) -> float:
        since = self._handover.status.step_since
        return 0.0 if since is None else now - since

    @property
    def alive(self) -> bool:
        return self._handover.state is not SchedulerState.STOPPED

    def describe(self) -> dict[str, Any]:
        return {
            "scheduler": "continuous_batcher",
            "max_sequences": self.limits.max_sequences,
            "max_batch_tokens": self.limits.max_batch_tokens,
            "max_prefill_tokens": self.limits.max_prefill_tokens,
            "max_queue_rows": self._loop_side.max_queue,
            "max_answer_tokens": self.max_answer_tokens,
            "running_sequences": self._handover.status.sequences,
            "queued_requests": self._handover.queued,
        }

    def load(self) -> Load:
        queued = self._handover.queued
        running = self._handover.status.sequences
        return Load(queued, queued + running, self._loop_side.in_flight)

    async def stop(self) -> None:
        """Refuse new requests; decode everything admitted to its end (or deadline)."""
        self._handover.control(Control.STOP)
        if not self._decoding.started:
            return
        await self._loop_side.stopped()
        await asyncio.to_thread(self._decoding.join)
        self._loop_side.close()
