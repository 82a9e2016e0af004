"""What the language-model frontends share (the native generate and score routes,
``serve.frontends.lm.http``; the OpenAI-compatible routes, ``serve.frontends.lm.openai_http``):
one call from its first byte to its answer.

:class:`LanguageModelCalls` routes a call to a language model's version and scheduler
(:class:`Admitted`), computes its deadline, reads its body within the size limit, admits
it (429 when the queue is full), tokenizes off the event loop when the body is large,
bounds the answer (``max_answer_tokens``), queues the generations and encodes a large
answer off the event loop; the call around these steps (errors in the frontend's own shape,
metrics, the access-log line, the answer's writer) is ``serve.frontends.http_calls``'s, as
for every HTTP frontend. :class:`CancelOnDisconnect` gives up on a generation whose client
went away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import orjson
from starlette.types import Message, Receive

from kernel.errors import InvalidInput, NotFound, RLServeError, quoted
from serve.dataplane.deadline import Deadline, LoopTurn, budget_ms
from serve.dataplane.kinds import ModelKind
from serve.dataplane.routing import Route, Router
from serve.dataplane.row_calls import INLINE_BODY_BYTES
from serve.frontends.http_calls import (
    JSON_HEADER,
    Call,
    Exchange,
    Headers,
    HttpCalls,
    read_body,
)
from serve.frontends.wire import decode_object, timeout_header_ms
from serve.lm.messages import Generation, TokenEvent
from serve.lm.model import LanguageModel
from serve.lm.scheduling.generation_stream import GenerationStream
from serve.lm.scheduling.scheduler import ContinuousBatchScheduler
from serve.lm.text import TextCodec

__all__ = [
    "Admitted",
    "CancelOnDisconnect",
    "LanguageModelCalls",
    "answer_tokens",
    "bound_answer",
    "json_answer",
    "next_events",
]

log = logging.getLogger("rlserve.generate")

# Answers of more token entries than this are built and encoded off the event loop (a
# token entry with its log-prob takes about 1-2 us to build and encode).
INLINE_ANSWER_TOKENS = 2048
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

Spec = TypeVar("Spec")
Work = TypeVar("Work")


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call routed to a language model and admitted to its queue."""

    model: str  # the served model's name
    scheduler: ContinuousBatchScheduler
    version: LanguageModel  # the version that checks and tokenizes the call
    pinned: int | None  # the version the caller named (None: whichever is active)
    deadline: Deadline


class CancelOnDisconnect:
    """While the answer is being produced, watch for the client going away (its body is
    read, so the next message is the disconnect) and give up on the call's generations
    then."""

    def __init__(self, receive: Receive, *streams: GenerationStream) -> None:
        self._receive, self._streams = receive, streams
        self._watch: asyncio.Task[Message] | None = None
        self.gone = False

    def __enter__(self) -> CancelOnDisconnect:
        self._watch = asyncio.ensure_future(self._receive())
        self._watch.add_done_callback(self._gone)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()

    def _gone(self, watch: asyncio.Task[Message]) -> None:
        if watch.cancelled() or watch.exception() is not None:
            return
        if watch.result().get("type") == "http.disconnect":
            self.gone = True
            for stream in self._streams:
                stream.cancel()


class LanguageModelCalls:
    """The steps every language-model call takes, whichever protocol it speaks."""

    def __init__(
        self, router: Router, calls: HttpCalls, max_body_bytes: int, *, turn: LoopTurn
    ) -> None:
        self.router = router
        self.http = calls  # the call around the LM steps: errors, metrics, access log
        self.max_body_bytes = max_body_bytes
        self.turn = turn  # how long a turn of the event loop takes now: deadlines count it

    def route(self, call: Call, model: str | None, version: int | None, action: str) -> Admitted:
        """The language model a call names (None: the default model) and its deadline; not
        yet admitted (:meth:`admit`). A model of another kind is NotFound for ``action``."""
        route = self.router.resolve(model, version)
        call.model, call.version = route.model, route.version.version
        scheduler, served = generation_parts(route, action)
        budget = budget_ms(route.default_deadline_ms, timeout_header_ms(call.timeout_header))
        deadline = self.turn.deadline(call.received_at, budget)
        return Admitted(route.model, scheduler, served, route.pinned, deadline)

    async def read(self, exchange: Exchange) -> bytes:
        """The call's whole body, within ``max_body_bytes`` (413 beyond)."""
        call = exchange.call
        body = await read_body(exchange.receive, call.declared_length, self.max_body_bytes)
        exchange.large = len(body) > INLINE_BODY_BYTES
        return body

    async def decode(self, exchange: Exchange, body: bytes) -> dict[str, Any]:
        """The body as a JSON object, decoded off the event loop when it is large."""
        if exchange.large:  # work in proportion to the body: off the event loop
            return await asyncio.to_thread(decode_object, body)
        return decode_object(body)

    @staticmethod
    def admit(admitted: Admitted, spent_on: str, requests: int = 1) -> None:
        """Refuse a call whose deadline passed (504) or whose ``requests`` (generations)
        the queue has no room for (429), before any work in proportion to it."""
        admitted.deadline.check(spent_on)
        admitted.scheduler.admit(requests, admitted.deadline.at)

    @staticmethod
    async def prepare(exchange: Exchange, prepare: Callable[[Spec], Work], spec: Spec) -> Work:
        """Tokenize on the event loop, or on a worker thread for a large body."""
        if exchange.large:
            return await asyncio.to_thread(prepare, spec)
        return prepare(spec)

    def codec(self, admitted: Admitted, version: int) -> TextCodec:
        """The tokenizer of the version that generated (a request not pinned to a version
        runs on the one active when it joins the batch): for tokens' texts."""
        if version == admitted.version.version:
            return admitted.version.codec
        try:
            _, served = generation_parts(self.router.resolve(admitted.model, version), "generate")
        except RLServeError:  # gone already: versions of a model share their tokenizer
            return admitted.version.codec
        return served.codec

    @staticmethod
    def queue(
        admitted: Admitted, generations: Sequence[Generation], *, tokens: bool
    ) -> list[GenerationStream]:
        """Queue a call's prepared generations together (in one turn of the event loop, so
        they join the same batches and a version swap pins them alike); when one is refused,
        none stays queued. A call whose answer would carry more token entries than the
        model's ``max_answer_tokens`` is refused before any is queued."""
        bound_answer(admitted, answer_tokens(generations), lambda: _product(generations))
        admitted.deadline.check("validating it")
        streams: list[GenerationStream] = []
        try:
            for generation in generations:
                streams.append(
                    admitted.scheduler.submit_generation(generation, admitted.pinned, tokens=tokens)
                )
        except BaseException:
            for stream in streams:
                stream.cancel()
            raise
        return streams


def bound_answer(admitted: Admitted, tokens: int, product: Callable[[], str]) -> None:
    """Refuse a call whose answer could carry more than the model's ``max_answer_tokens``
    token entries, naming the ``product()`` that makes ``tokens`` (said only then): an
    answer can grow far faster than the request that asks for it."""
    bound = admitted.scheduler.max_answer_tokens
    if tokens > bound:
        raise InvalidInput(
            f"this call's answer could carry {tokens} token entries ({product()}); model "
            f"{quoted(admitted.model)} answers at most {bound} (its max_answer_tokens "
            "setting): ask for fewer choices (n), tokens (max_tokens, max_new_tokens, echo) "
            "or alternatives (top_logprobs)"
        )


def answer_tokens(generations: Sequence[Generation]) -> int:
    """The token entries a call's generations can answer, at most."""
    return sum(generation.answer_tokens for generation in generations)


def _product(generations: Sequence[Generation]) -> str:
    """What makes a call's answer_tokens, for the refusal."""
    width = 1 + generations[0].spec.top_logprobs  # every generation of a call asks alike
    longest = max(generation.answer_tokens for generation in generations) // width
    return (
        f"{len(generations)} generation(s) of up to {longest} tokens (new, and echoed "
        f"prompt) times 1 + {width - 1} top_logprobs"
    )


async def json_answer(
    exchange: Exchange, tokens: int, build: Callable[[], Any], headers: Headers
) -> None:
    """A whole JSON answer of ``tokens`` token entries: built and encoded on the event loop
    when small, on a worker thread otherwise (the loop keeps serving meanwhile; the thread
    gives the interpreter back every switch interval), so no answer holds the loop in
    proportion to its size."""

    def encoded() -> bytes:
        return orjson.dumps(build())

    body = encoded() if tokens <= INLINE_ANSWER_TOKENS else await asyncio.to_thread(encoded)
    await exchange.answer(200, body, [*headers, JSON_HEADER])


def generation_parts(route: Route, action: str) -> tuple[ContinuousBatchScheduler, LanguageModel]:
    """A language model's route: its scheduler and version, as what they are (the model's
    kind decided both); a model of another kind is NotFound for ``action``."""
    if route.kind is not ModelKind.GENERATIONS:
        raise NotFound(
            f"model {route.model!r} is not a language model: it has no {action} route; "
            f"POST /v1/models/{route.model}/predict with observations"
        )
    return cast(ContinuousBatchScheduler, route.scheduler), cast(LanguageModel, route.version)


async def next_events(stream: GenerationStream) -> list[TokenEvent]:
    """The stream's next token event and those already behind it (written together);
    StopAsyncIteration at its end, the error that ended it otherwise."""
    return [await anext(stream), *stream.drain()]
