"""The continuous-batching scheduler: one per language model, decoding on its own thread.

Requests to generate and to score are admitted into a bounded queue (``max_queue_rows``
counts requests here; beyond it 429 with Retry-After). A decoding thread runs steps back
to back while there is work. At every step boundary it asks
``serve.lm.scheduling.step_plan.plan_step`` which waiting requests join, under the
model's limits in tokens and sequences, and then:

1. prefills each joining generation alone and chooses its first token (a request can end
   right there), and runs each joining scoring (one forward pass over its completions);
2. decodes every running sequence one token further in one graph call per version: the
   newcomers are merged into the batch's key/value cache first, the sequences that
   finished leave at once.

So a request that arrives while others decode joins at the next step, without waiting for
them to finish. A step's tokens, every sequence's together, are handed to the event loop
in one piece, where each request's
:class:`~serve.lm.scheduling.generation_stream.GenerationStream` gets them. The loop is woken
once for whatever is waiting: steps that end while it is still busy with earlier ones
join the same hand-over (and a stream then writes their tokens together), so the decoding
thread never waits for the loop, and the loop is never woken more often than it can
answer. The metrics get a :class:`~serve.lm.scheduling.generation_record.StepRecord` of the
steps since the last one with a hand-over that answers a request, and at least every
SEND_EVERY_S while decoding.

Versions: a request runs on the version it names (pinned), else on the version that is
active when it joins the batch (it is tokenized again if another version prepared it). A
running sequence finishes on the version it started on: each version has its own batch,
and the thread steps every batch that has sequences, so after a swap the old version's
batch drains while new requests decode on the new one.

Deadlines: one timer per scheduler, set for the earliest deadline in flight: a request
still queued is answered 504 and never runs; a running one is answered 504 and leaves the
batch at the next step. Hold: no step runs until resume (queued and running requests wait
within their deadlines). Stop: new requests are refused; everything admitted is decoded to
its end (or its deadline), then the thread ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from serve.config import ModelSettings
from serve.dataplane.messages import InferenceResponse, Prepared
from serve.dataplane.model import ServedModel, VersionSource
from serve.dataplane.scheduler import NOT_RUN, Load
from serve.errors import (
    DeadlineExceeded,
    InvalidInput,
    QueueFull,
    RLServeError,
    ServiceUnavailable,
    one_line,
)
from serve.lm.batch import DecodeBatch
from serve.lm.messages import (
    Generation,
    GenerationResult,
    ScoreResult,
    Scoring,
    TokenEvent,
)
from serve.lm.model import LanguageModel
from serve.lm.scheduling.generation_record import GenerationSink, StepRecord
from serve.lm.scheduling.generation_stream import GenerationStream
from serve.lm.scheduling.step_plan import (
    Occupancy,
    StepLimits,
    Waiting,
    plan_step,
)
from serve.lm.scoring import score
from serve.lm.sequence import DecodingSequence

log = logging.getLogger("rlserve.generation")

# Steps that answer nobody hand their metrics to the event loop this often, not every step
# (their tokens, if streamed, go at once): the loop counts a step's work only when needed.
SEND_EVERY_S = 0.05


class _Refused(Enum):
    STOPPED = "stopped"
    FULL = "full"


@dataclass(slots=True, eq=False)
class _Ticket:
    """One admitted request, from the queue to its answer."""

    work: Generation | Scoring  # prepared by the version work.version
    version: int | None  # pinned (named by the caller, or by a draining swap); None: active
    enqueued_at: float
    stream: GenerationStream | None  # a generation's
    future: asyncio.Future[ScoreResult] | None  # a scoring's
    done: bool = False  # answered (set on the loop; the thread drops it at a step boundary)
    started: bool = False  # it left the queue to run (set by the thread)
    streamed: bool = False  # its token events are wanted (set with its stream)
    last_token_at: float = 0.0  # thread only
    received_at: float = field(init=False)
    deadline: float = field(init=False)

    def __post_init__(self) -> None:
        self.received_at = self.work.spec.received_at
        self.deadline = self.work.spec.deadline

    def waiting(self) -> Waiting:
        work = self.work
        if isinstance(work, Scoring):
            return Waiting(work.tokens, 0, 0, self.deadline)
        prompt = len(work.prompt_ids)
        return Waiting(prompt, prompt + work.max_new_tokens, 1, self.deadline)


@dataclass(frozen=True, slots=True)
class _Started:
    version: int
    sha256: str


_Outcome = _Started | TokenEvent | GenerationResult | ScoreResult | RLServeError


class ContinuousBatchScheduler:
    def __init__(
        self,
        name: str,
        versions: VersionSource,
        settings: ModelSettings,
        sink: GenerationSink | None = None,
    ) -> None:
        self.name = name
        self.versions = versions
        self.limits = StepLimits(
            settings.max_sequences, settings.max_batch_tokens, settings.max_prefill_tokens
        )
        self.max_queue = settings.max_queue_rows
        self.held = False
        self._sink = sink
        self._queue: deque[_Ticket] = deque()  # guarded by _lock
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._batches: dict[int, _VersionBatch] = {}  # by version; thread only
        self._running = 0  # sequences in the batches (written by the thread)
        self._reserves: Counter[int] = Counter()  # their reserve_tokens (thread only)
        self._running_versions: frozenset[int] = frozenset()  # written by the thread
        self._step_since: float | None = None  # a step is running since then
        self._seconds_per_request = 0.0  # measured: time between answers while busy
        self._last_answer_at: float | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._stopped = asyncio.Event()
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = math.inf
        self._in_flight: set[_Ticket] = set()  # admitted and not answered (loop only)
        self._outcomes: list[tuple[_Ticket, _Outcome]] = []  # not yet handed over (thread)
        self._tally = _StepTally()  # thread only
        self._sent_at = 0.0
        self._sent_cache_bytes = 0  # the key/value cache the last record said it held
        self._handed: list[_Handover] = []  # handed over, not yet taken by the loop
        self._handed_lock = threading.Lock()

    # ------------------------------------------------------------------ admission

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._decode_loop, name=f"decode-{self.name}", daemon=True
        )
        self._thread.start()

    def submit(self, prepared: Prepared, version: int | None) -> asyncio.Future[InferenceResponse]:
        raise InvalidInput(
            f"model {self.name!r} is a language model: POST /v1/models/{self.name}/generate "
            "or /score; it takes no observations"
        )

    def submit_generation(
        self, generation: Generation, version: int | None, *, tokens: bool
    ) -> GenerationStream:
        """Queue a generation prepared by a version (``version``: the one the caller named,
        None for whichever is active when it joins); ``tokens``: stream its token events."""
        self.admit(1, generation.deadline)
        assert self._loop is not None
        ticket = _Ticket(generation, version, time.monotonic(), None, None)
        ticket.stream = GenerationStream(self._loop, lambda: self._cancel(ticket), tokens=tokens)
        ticket.streamed = tokens
        self._enqueue(ticket)
        return ticket.stream

    def submit_scoring(self, scoring: Scoring, version: int | None) -> asyncio.Future[ScoreResult]:
        self.admit(1, scoring.deadline)
        assert self._loop is not None
        future: asyncio.Future[ScoreResult] = self._loop.create_future()
        self._enqueue(_Ticket(scoring, version, time.monotonic(), None, future))
        return future

    def admit(self, rows: int, deadline: float) -> None:
        refused = self._refused(rows)
        if refused is _Refused.STOPPED:
            raise ServiceUnavailable(
                f"model {self.name!r} is not running: the server is starting or shutting down"
            )
        if refused is _Refused.FULL:
            waiting = len(self._queue)
            raise QueueFull(
                f"model {self.name!r}: queue full ({waiting} of {self.max_queue} requests "
                "waiting to decode); retry shortly",
                retry_after_s=max(1, math.ceil(waiting * self._seconds_per_request)),
            )

    def would_admit(self, rows: int, deadline: float) -> bool:
        return self._refused(rows) is None

    def _refused(self, rows: int) -> _Refused | None:
        if self._closing or self._loop is None:
            return _Refused.STOPPED
        if len(self._queue) + rows > self.max_queue:
            return _Refused.FULL
        return None

    def _enqueue(self, ticket: _Ticket) -> None:
        self._in_flight.add(ticket)
        with self._work:
            self._queue.append(ticket)
            self._work.notify()
        if ticket.deadline < self._sweep_at:
            self._arm_sweep(ticket.deadline)

    def _cancel(self, ticket: _Ticket) -> None:
        """The caller gave up: answer nothing more; it leaves the queue or batch."""
        self._settle(ticket, ServiceUnavailable("the client went away"))

    # ------------------------------------------------------------------ control

    def pin_queued(self, version: int) -> None:
        with self._lock:
            for ticket in self._queue:
                if ticket.version is None:
                    ticket.version = version

    def pinned_versions(self) -> set[int]:
        with self._lock:
            queued = {t.version for t in self._queue if t.version is not None and not t.done}
        return queued | self._running_versions

    def hold(self) -> None:
        self.held = True

    def resume(self) -> None:
        with self._work:
            self.held = False
            self._work.notify()

    # ------------------------------------------------------------------ the decoding thread

    def _decode_loop(self) -> None:
        while True:
            with self._work:
                while not self._has_work():
                    self._send(force=True)
                    if self._closing and not self._queue and not self._running:
                        self._post(self._stopped.set)
                        return
                    self._work.wait()
                joining, expired = self._plan()
            try:
                self._step(joining, expired)
            except Exception as exc:  # a bug: fail what it held, keep serving the rest
                log.exception("decoding step of %s failed", self.name)
                self._abandon([*joining, *expired], self._failure(exc))

    def _has_work(self) -> bool:
        if self.held and not self._closing:
            return False
        return bool(self._queue) or self._running > 0

    def _plan(self) -> tuple[list[_Ticket], list[_Ticket]]:
        """Pop what joins now and what expired (under the lock)."""
        if not self._queue:
            return [], []
        live = [t for t in self._queue if not t.done]
        decision = plan_step(
            [t.waiting() for t in live],
            Occupancy(self._running, max(self._reserves, default=0)),
            time.monotonic(),
            self.limits,
        )
        chosen = {*decision.join, *decision.expired}
        self._queue = deque(t for i, t in enumerate(live) if i not in chosen)
        return [live[i] for i in decision.join], [live[i] for i in decision.expired]

    def _step(self, joining: list[_Ticket], expired: list[_Ticket]) -> None:
        self._step_since = time.monotonic()
        outcomes, tally = self._outcomes, self._tally
        outcomes += [(t, DeadlineExceeded(NOT_RUN)) for t in expired]
        for ticket in joining:
            self._join(ticket, outcomes, tally)
        sequences = 0
        for version, running in list(self._batches.items()):
            for gone in running.batch.drop(lambda t: t.done):
                self._left(gone)
            if len(running.batch):
                sequences += self._decode(running, outcomes, tally)
            if not len(running.batch):
                del self._batches[version]  # the version may be unloaded now
        if sequences:
            tally.step_sequences.append(sequences)
        self._running_versions = frozenset(self._batches)
        self._step_since = None
        self._send(force=False)

    def _abandon(self, tickets: list[_Ticket], error: RLServeError) -> None:
        """Answer ``error`` to these and to every running sequence, and start afresh."""
        for running in self._batches.values():
            tickets += running.batch.drop(lambda t: True)
        self._batches, self._running, self._reserves = {}, 0, Counter()
        self._running_versions = frozenset()
        self._step_since = None
        self._outcomes += [(ticket, error) for ticket in tickets]
        self._send(force=True)

    def _send(self, *, force: bool) -> None:
        """Hand what the steps produced to the event loop: outcomes at once; the metrics
        with an answer, every SEND_EVERY_S, or before the thread idles (``force``). A change
        of the cache alone is news too (a step that only dropped a cancelled sequence)."""
        outcomes, tally = self._outcomes, self._tally
        now = time.monotonic()
        cache_bytes = sum(b.batch.nbytes for b in self._batches.values())
        news = not tally.empty or cache_bytes != self._sent_cache_bytes
        due = news and (force or bool(tally.answered) or now - self._sent_at >= SEND_EVERY_S)
        if not outcomes and not due:
            return
        record = None
        if due:
            record = StepRecord(
                self.name,
                tuple(tally.step_sequences),
                cache_bytes,
                tally.new_tokens,
                tally.prompt_tokens,
                tuple(tally.first_token_s),
                tuple(tally.inter_token_s),
                tuple(tally.answered),
            )
            self._tally, self._sent_at, self._sent_cache_bytes = _StepTally(), now, cache_bytes
        self._outcomes = []
        with self._handed_lock:
            wake = not self._handed  # else the loop is already woken for the earlier ones
            self._handed.append(_Handover(outcomes, record))
        if wake:
            self._post(self._take_handed)

    def _join(
        self, ticket: _Ticket, outcomes: list[tuple[_Ticket, _Outcome]], tally: _StepTally
    ) -> None:
        if ticket.done:
            return
        ticket.started = True
        try:
            model, work = self._version_for(ticket)
            if isinstance(work, Scoring):
                result = self._score(model, work)
                tally.prompt_tokens += work.tokens
                tally.answered.append((model.version, time.monotonic() - ticket.received_at))
                outcomes.append((ticket, result))
                return
            sequence = model.sequence(work, streamed=ticket.streamed)
            running = self._batches.get(model.version)
            if running is None:
                running = _VersionBatch(model, DecodeBatch(model.decoder))
            event = running.batch.prefill(ticket, sequence)
            if len(running.batch):
                self._batches[model.version] = running
        except RLServeError as exc:
            outcomes.append((ticket, exc))
            return
        except Exception as exc:
            outcomes.append((ticket, self._failure(exc)))
            return
        now = time.monotonic()
        ticket.last_token_at = now
        tally.prompt_tokens += len(work.prompt_ids)
        tally.new_tokens += 1
        tally.first_token_s.append(now - ticket.received_at)
        if ticket.streamed:
            outcomes += [(ticket, _Started(model.version, model.sha256)), (ticket, event)]
        if sequence.finish is not None:
            outcomes.append((ticket, self._result(model, sequence)))
            tally.answered.append((model.version, now - ticket.received_at))
        else:
            self._running += 1
            self._reserves[ticket.waiting().reserve_tokens] += 1

    def _version_for(self, ticket: _Ticket) -> tuple[LanguageModel, Generation | Scoring]:
        """The version a request runs on, and the request as that version prepared it."""
        work = ticket.work
        target = ticket.version if ticket.version is not None else self.versions.active
        target = work.version if target is None else target
        model = _language_model(self.versions.get(target), self.name, target)
        if target == work.version:
            return model, work
        if isinstance(work, Scoring):
            return model, model.prepare_scoring(work.spec)
        return model, model.prepare_generation(work.spec)

    def _score(self, model: LanguageModel, work: Scoring) -> ScoreResult:
        scores = score(model.decoder, work)
        return ScoreResult(model.name, model.version, model.sha256, len(work.prompt_ids), scores)

    def _decode(
        self,
        running: _VersionBatch,
        outcomes: list[tuple[_Ticket, _Outcome]],
        tally: _StepTally,
    ) -> int:
        """One step of a version's batch; returns the sequences it decoded."""
        model, batch = running.model, running.batch
        decoded = len(batch)
        try:
            emitted = batch.step()
        except Exception as exc:
            error = self._failure(exc)
            for owner in batch.drop(lambda t: True):
                outcomes.append((owner, error))
                self._left(owner)
            return 0
        now = time.monotonic()
        tally.new_tokens += len(emitted)
        gaps = tally.inter_token_s
        for ticket, sequence, event in emitted:
            gaps.append(now - ticket.last_token_at)
            ticket.last_token_at = now
            if ticket.streamed:
                outcomes.append((ticket, event))
            if sequence.finish is not None:
                outcomes.append((ticket, self._result(model, sequence)))
                tally.answered.append((model.version, now - ticket.received_at))
                self._left(ticket)
        return decoded

    def _left(self, ticket: _Ticket) -> None:
        self._running -= 1
        reserve = ticket.waiting().reserve_tokens
        self._reserves[reserve] -= 1
        if not self._reserves[reserve]:
            del self._reserves[reserve]

    def _result(self, model: LanguageModel, sequence: DecodingSequence) -> GenerationResult:
        assert sequence.finish is not None
        return GenerationResult(
            model.name,
            model.version,
            model.sha256,
            len(sequence.generation.prompt_ids),
            tuple(sequence.token_ids),
            tuple(sequence.log_probs),
            sequence.text,
            sequence.finish,
        )

    def _failure(self, exc: Exception) -> RLServeError:
        log.error("model %s failed while decoding: %s", self.name, one_line(exc))
        return RLServeError(f"model {self.name!r} failed on this input: {one_line(exc)}")

    def _post(self, callback: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to answer
            self._loop.call_soon_threadsafe(callback)

    # ------------------------------------------------------------------ on the event loop

    def _take_handed(self) -> None:
        with self._handed_lock:
            handed, self._handed = self._handed, []
        for handover in handed:
            self._deliver(handover.outcomes, handover.record)

    def _deliver(self, outcomes: list[tuple[_Ticket, _Outcome]], record: StepRecord | None) -> None:
        for ticket, outcome in outcomes:
            self._deliver_one(ticket, outcome)
        if record is not None:
            self._record_step(record)

    def _deliver_one(self, ticket: _Ticket, outcome: _Outcome) -> None:
        if isinstance(outcome, TokenEvent):
            if ticket.stream is not None and not ticket.done:
                ticket.stream.push(outcome)
        elif isinstance(outcome, _Started):
            if ticket.stream is not None:
                ticket.stream.started(outcome.version, outcome.sha256)
        else:
            self._settle(ticket, outcome)

    def _record_step(self, record: StepRecord) -> None:
        if record.answered:
            now = time.monotonic()
            if self._last_answer_at is not None and self._running:
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

    def _settle(
        self, ticket: _Ticket, outcome: GenerationResult | ScoreResult | RLServeError
    ) -> None:
        if ticket.done:
            return
        ticket.done = True
        self._in_flight.discard(ticket)
        if ticket.stream is not None:
            if isinstance(outcome, RLServeError):
                ticket.stream.fail(outcome)
            elif isinstance(outcome, GenerationResult):
                ticket.stream.finish(outcome)
        elif ticket.future is not None and not ticket.future.done():
            if isinstance(outcome, RLServeError):
                ticket.future.set_exception(outcome)
            elif isinstance(outcome, ScoreResult):
                ticket.future.set_result(outcome)

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
        for ticket in [t for t in self._in_flight if t.deadline <= now]:
            if not ticket.started:
                self._settle(ticket, DeadlineExceeded(NOT_RUN))
            else:
                budget_ms = (ticket.deadline - ticket.received_at) * 1000
                self._settle(
                    ticket,
                    DeadlineExceeded(
                        f"no answer within the request's deadline of {budget_ms:g} ms"
                    ),
                )
        if self._in_flight:
            self._arm_sweep(min(t.deadline for t in self._in_flight))

    # ------------------------------------------------------------------ health and stop

    def stuck_for(self, now: float) -> float:
        since = self._step_since
        return 0.0 if since is None else now - since

    @property
    def alive(self) -> bool:
        return not (self._closing and self._stopped.is_set())

    def describe(self) -> dict[str, Any]:
        return {
            "scheduler": "continuous_batcher",
            "max_sequences": self.limits.max_sequences,
            "max_batch_tokens": self.limits.max_batch_tokens,
            "max_prefill_tokens": self.limits.max_prefill_tokens,
            "max_queue_rows": self.max_queue,
            "running_sequences": self._running,
            "queued_requests": len(self._queue),
        }

    def load(self) -> Load:
        queued = len(self._queue)
        return Load(queued, queued + self._running, len(self._in_flight))

    async def stop(self) -> None:
        """Refuse new requests; decode everything admitted to its end (or deadline)."""
        self._closing = True
        thread = self._thread
        if thread is None:
            self._stopped.set()
            return
        with self._work:
            self._work.notify()
        await self._stopped.wait()
        await asyncio.to_thread(thread.join)
        if self._sweep is not None:
            self._sweep.cancel()


@dataclass(frozen=True, slots=True)
class _Handover:
    """What the decoding thread hands the event loop at once: outcomes of steps, and the
    metrics of the steps since the last record (None: they go with a later one)."""

    outcomes: list[tuple[_Ticket, _Outcome]]
    record: StepRecord | None


@dataclass(frozen=True, slots=True)
class _VersionBatch:
    """A version's running sequences, with the version itself (held while they run, even
    if the version is unloaded meanwhile)."""

    model: LanguageModel
    batch: DecodeBatch[_Ticket]


@dataclass
class _StepTally:
    """What steps did since the last hand-over to the event loop (for the metrics)."""

    step_sequences: list[int] = field(default_factory=list)
    new_tokens: int = 0
    prompt_tokens: int = 0
    first_token_s: list[float] = field(default_factory=list)
    inter_token_s: list[float] = field(default_factory=list)
    answered: list[tuple[int, float]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.step_sequences or self.new_tokens or self.prompt_tokens or self.answered)


def _language_model(model: ServedModel | None, name: str, version: int) -> LanguageModel:
    if model is None:
        raise ServiceUnavailable(f"model {name!r} version {version} was unloaded; retry")
    if not isinstance(model, LanguageModel):
        raise InvalidInput(f"model {name!r} version {version} is not a language model")
    return model
