"""The continuous-batching scheduler's decoding thread: step after step while there is work.

At every step boundary it takes a :class:`~serve.lm.scheduling.handover.Step` from the
hand-over (who joins, under the step rules; who left on the loop's side), and then:

1. prefills each joining generation alone and chooses its first token (a request can end
   right there), and runs each joining scoring (one forward pass over its completions);
   what that produced is handed to the event loop at once, so a newcomer's first token
   never waits for the running batch's decoding (and, while many join, at least every
   JOINING_SEND_S, so that the first need not wait for the last to join);
2. decodes every running sequence one token further in one graph call per version: the
   newcomers are merged into the batch's key/value cache first, the sequences that
   finished leave at once.

A step's outcomes, every sequence's together, are handed to the event loop in one piece;
steps that end while the loop is still busy with earlier ones join the same hand-over, so
the thread never waits for the loop. The metrics get a record of the steps since the last
one with a hand-over that answers a request, and at least every SEND_EVERY_S while
decoding.

Versions: a request runs on the version it names (pinned), else on the version that is
active when it joins the batch (it is tokenized again if another version prepared it). A
running sequence finishes on the version it started on: each version has its own batch,
and the thread steps every batch that has sequences, so after a swap the old version's
batch drains while new requests decode on the new one.

Everything here is touched by the decoding thread only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import cast

from kernel.errors import InvalidInput, RLServeError, ServiceUnavailable, one_line
from serve.dataplane.kinds import ModelKind
from serve.dataplane.model import ServedModel, VersionSource
from serve.lm.batch import DecodeBatch
from serve.lm.messages import Generation, GenerationResult, ScoreResult, Scoring
from serve.lm.model import LanguageModel
from serve.lm.scheduling.generation_record import StepTally
from serve.lm.scheduling.handover import (
    IDLE,
    Handed,
    Handover,
    Outcome,
    Request,
    Started,
    Step,
    ThreadStatus,
)
from serve.lm.scheduling.step_plan import Occupancy, StepLimits
from serve.lm.scoring import score
from serve.lm.sequence import DecodingSequence

__all__ = ["JOINING_SEND_S", "SEND_EVERY_S", "DecodingThread"]

log = logging.getLogger("rlserve.generation")

# Steps that answer nobody hand their metrics to the event loop this often, not every step
# (their tokens, if streamed, go at once): the loop counts a step's work only when needed.
SEND_EVERY_S = 0.05
# Joins at one boundary hand their first tokens over at least this often (a group of 32
# takes about 2 ms to join): the first calls need not wait for the last to join.
JOINING_SEND_S = 0.0005


@dataclass(slots=True, eq=False)
class _Running:
    """A generation in a batch."""

    request: Request
    last_token_at: float = 0.0


@dataclass(frozen=True, slots=True)
class _VersionBatch:
    """A version's running sequences, with the version itself (held while they run, even
    if the version is unloaded meanwhile)."""

    model: LanguageModel
    batch: DecodeBatch[_Running]


class DecodingThread:
    def __init__(
        self, name: str, versions: VersionSource, limits: StepLimits, handover: Handover
    ) -> None:
        self.name = name
        self.versions = versions
        self.limits = limits
        self._handover = handover
        self._thread: threading.Thread | None = None
        self._batches: dict[int, _VersionBatch] = {}  # by version
        self._running = 0  # sequences in the batches
        self._reserves: Counter[int] = Counter()  # their reserve_tokens
        self._outcomes: list[tuple[int, Outcome]] = []  # not yet handed over
        self._tally = StepTally()
        self._sent_at = 0.0
        self._sent_cache_bytes = 0  # the key/value cache the last record said it held

    def start(self) -> None:
        """Called on the event loop, once."""
        self._thread = threading.Thread(target=self._run, name=f"decode-{self.name}", daemon=True)
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    # ------------------------------------------------------------------ on the thread

    def _run(self) -> None:
        handover = self._handover
        while True:
            occupancy = Occupancy(self._running, max(self._reserves, default=0))
            step = handover.next_step(occupancy, self.limits)
            if step is None:  # nothing to do now: say everything, then wait
                self._send(force=True)
                if not handover.wait(self._running):
                    return
                continue
            try:
                self._step(step)
            except Exception as exc:  # a bug: fail what it held, keep serving the rest
                log.exception("decoding step of %s failed", self.name)
                self._abandon(step.joining, self._failure(exc))

    def _step(self, step: Step) -> None:
        sent_at = time.monotonic()
        for request in step.joining:
            self._join(request)
            if time.monotonic() - sent_at >= JOINING_SEND_S:  # many joins: the first go
                self._send(force=False)
                sent_at = time.monotonic()
        if step.joining:  # their first tokens go now, not after the batch's decoding
            self._send(force=False)
        sequences, gone = 0, step.gone
        for version, running in list(self._batches.items()):
            if gone:
                for left in running.batch.drop(lambda r: r.request.id in gone):
                    self._left(left.request)
            if len(running.batch):
                sequences += self._decode(running)
            if not len(running.batch):
                del self._batches[version]  # the version may be unloaded now
        if sequences:
            self._tally.step_sequences.append(sequences)
        self._handover.report(ThreadStatus(self._running, frozenset(self._batches), None))
        self._send(force=False)

    def _abandon(self, joining: list[Request], error: RLServeError) -> None:
        """Answer ``error`` to these and to every running sequence, and start afresh."""
        ids = [request.id for request in joining]
        for running in self._batches.values():
            ids += [r.request.id for r in running.batch.drop(lambda r: True)]
        self._batches, self._running, self._reserves = {}, 0, Counter()
        self._handover.report(IDLE)
        self._outcomes += [(id, error) for id in ids]
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
            record = tally.record(self.name, cache_bytes)
            self._tally, self._sent_at, self._sent_cache_bytes = StepTally(), now, cache_bytes
        self._outcomes = []
        self._handover.hand(Handed(outcomes, record))

    def _join(self, request: Request) -> None:
        outcomes, tally = self._outcomes, self._tally
        received_at = request.work.spec.received_at
        try:
            model, work = self._version_for(request)
            if isinstance(work, Scoring):
                result = _scored(model, work)
                tally.prompt_tokens += work.tokens
                tally.answered.append((model.version, time.monotonic() - received_at))
                outcomes.append((request.id, result))
                return
            sequence = model.sequence(work, streamed=request.streamed)
            running = self._batches.get(model.version)
            if running is None:
                budget = self.limits.max_batch_tokens
                running = _VersionBatch(model, DecodeBatch(model.decoder, tokens=budget))
            owner = _Running(request)
            event, prefilled = running.batch.prefill(owner, sequence)
            if len(running.batch):
                self._batches[model.version] = running
        except RLServeError as exc:
            outcomes.append((request.id, exc))
            return
        except Exception as exc:
            outcomes.append((request.id, self._failure(exc)))
            return
        now = time.monotonic()
        owner.last_token_at = now
        tally.prompt_tokens += prefilled  # a shared prompt ran once
        tally.new_tokens += 1
        tally.first_token_s.append(now - received_at)
        if request.streamed:
            outcomes += [(request.id, Started(model.version, model.sha256)), (request.id, event)]
        if sequence.finish is not None:
            outcomes.append((request.id, _generated(model, sequence)))
            tally.answered.append((model.version, now - received_at))
        else:
            self._running += 1
            self._reserves[request.waiting.reserve_tokens] += 1

    def _version_for(self, request: Request) -> tuple[LanguageModel, Generation | Scoring]:
        """The version a request runs on, and the request as that version prepared it."""
        work = request.work
        target = request.version if request.version is not None else self.versions.active
        target = work.version if target is None else target
        model = _language_model(self.versions.get(target), self.name, target)
        if target == work.version:
            return model, work
        if isinstance(work, Scoring):
            return model, model.prepare_scoring(work.spec)
        return model, model.prepare_generation(work.spec)

    def _decode(self, running: _VersionBatch) -> int:
        """One step of a version's batch; returns the sequences it decoded."""
        outcomes, tally = self._outcomes, self._tally
        model, batch = running.model, running.batch
        decoded = len(batch)
        try:
            emitted = batch.step()
        except Exception as exc:
            error = self._failure(exc)
            for owner in batch.drop(lambda r: True):
                outcomes.append((owner.request.id, error))
                self._left(owner.request)
            return 0
        now = time.monotonic()
        tally.new_tokens += len(emitted)
        gaps = tally.inter_token_s
        for owner, sequence, event in emitted:
            gaps.append(now - owner.last_token_at)
            owner.last_token_at = now
            request = owner.request
            if request.streamed:
                outcomes.append((request.id, event))
            if sequence.finish is not None:
                outcomes.append((request.id, _generated(model, sequence)))
                tally.answered.append((model.version, now - request.work.spec.received_at))
                self._left(request)
        return decoded

    def _left(self, request: Request) -> None:
        self._running -= 1
        reserve = request.waiting.reserve_tokens
        self._reserves[reserve] -= 1
        if not self._reserves[reserve]:
            del self._reserves[reserve]

    def _failure(self, exc: Exception) -> RLServeError:
        log.error("model %s failed while decoding: %s", self.name, one_line(exc))
        return RLServeError(f"model {self.name!r} failed on this input: {one_line(exc)}")


def _scored(model: LanguageModel, work: Scoring) -> ScoreResult:
    scores = score(model.decoder, work)
    return ScoreResult(model.name, model.version, model.sha256, len(work.prompt_ids), scores)


def _generated(model: LanguageModel, sequence: DecodingSequence) -> GenerationResult:
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
        tuple(sequence.top),
        sequence.prompt,
    )


def _language_model(model: ServedModel | None, name: str, version: int) -> LanguageModel:
    if model is None:
        raise ServiceUnavailable(f"model {name!r} version {version} was unloaded; retry")
    if model.model_kind is not ModelKind.GENERATIONS:  # the lifecycle loads no other kind
        raise InvalidInput(f"model {name!r} version {version} is not a language model")
    return cast(LanguageModel, model)
