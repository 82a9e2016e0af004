"""What the language-model frontends share (the native generate and score routes,
``serve.dataplane.lm_http``; the OpenAI-compatible routes, ``serve.dataplane.openai_http``):
one call from its first byte to its answer.

:class:`LanguageModelCalls` routes a call to a language model's version and scheduler
(:class:`Admitted`), computes its deadline, reads its body within the size limit, admits
it (429 when the queue is full), tokenizes off the event loop when the body is large,
submits a generation, answers errors in the frontend's own shape, counts refusals in the
metrics and writes the access-log line. :class:`Exchange` writes the answer, whole or as
event chunks; :class:`CancelOnDisconnect` gives up on a generation whose client went away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from starlette.types import Message, Receive, Scope, Send

from serve.access import log_exchange
from serve.dataplane.deadline import Deadline, LoopTurn, budget_ms
from serve.dataplane.exchange import (
    INLINE_BODY_BYTES,
    Call,
    Disconnected,
    read_body,
    start_call,
)
from serve.dataplane.routing import Router
from serve.dataplane.wire import decode_object, timeout_header_ms
from serve.errors import NotFound, RLServeError
from serve.lm.messages import GenerationSpec, TokenEvent
from serve.lm.model import LanguageModel
from serve.lm.scheduling.generation_stream import GenerationStream
from serve.lm.scheduling.scheduler import ContinuousBatchScheduler
from serve.metrics import Metrics
from serve.status import http_headers

__all__ = [
    "Admitted",
    "CancelOnDisconnect",
    "ErrorAnswer",
    "Exchange",
    "LanguageModelCalls",
    "next_events",
    "stamp",
]

log = logging.getLogger("rlserve.generate")

_JSON_HEADER = (b"content-type", b"application/json")
_CLOSE_HEADER = (b"connection", b"close")
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

Spec = TypeVar("Spec")
Work = TypeVar("Work")


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An error as one frontend writes it: its HTTP status and its JSON body."""

    status: int
    body: Any


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call routed to a language model and admitted to its queue."""

    model: str  # the served model's name
    scheduler: ContinuousBatchScheduler
    version: LanguageModel  # the version that checks and tokenizes the call
    pinned: int | None  # the version the caller named (None: whichever is active)
    deadline: Deadline


class Exchange:
    """One call's answer as it is written: status, headers, body or event chunks."""

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, call: Call, draining: Callable[[], bool]
    ) -> None:
        self.scope, self.receive, self._send, self.call = scope, receive, send, call
        self._draining = draining
        self.status = 0
        self.started = False
        self.large = False  # its body is large: work in proportion to it goes off the loop

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.started = status, True
        headers = [*headers, (b"x-request-id", self.call.request_id.encode("latin-1"))]
        if self._draining():
            headers.append(_CLOSE_HEADER)
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def chunk(self, body: bytes, *, last: bool = False) -> None:
        message: Message = {"type": "http.response.body", "body": body, "more_body": not last}
        await self._send(message)

    async def json(self, status: int, content: Any, headers: list[tuple[bytes, bytes]]) -> None:
        body = orjson.dumps(content)
        length = (b"content-length", str(len(body)).encode())
        await self.start(status, [*headers, _JSON_HEADER, length])
        await self.chunk(body, last=True)


class CancelOnDisconnect:
    """While the answer is being produced, watch for the client going away (its body is
    read, so the next message is the disconnect) and give up on the generation then."""

    def __init__(self, receive: Receive, stream: GenerationStream) -> None:
        self._receive, self._stream = receive, stream
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
            self._stream.cancel()


class LanguageModelCalls:
    """The steps every language-model call takes, whichever protocol it speaks."""

    def __init__(
        self,
        router: Router,
        metrics: Metrics,
        max_body_bytes: int,
        draining: Callable[[], bool],
        *,
        access_log: bool,
        turn: LoopTurn,
    ) -> None:
        self.router = router
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.draining = draining
        self.access_log = access_log
        self.turn = turn  # how long a turn of the event loop takes now: deadlines count it

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        handle: Callable[[Exchange], Awaitable[None]],
        render: Callable[[RLServeError], ErrorAnswer],
    ) -> None:
        """Run ``handle`` on the call; an error it raises is answered as ``render`` writes
        it (unless a stream already started), counted, and logged when unexpected."""
        exchange = Exchange(scope, receive, send, start_call(scope), self.draining)
        try:
            await handle(exchange)
        except RLServeError as exc:
            await self._answer_error(exchange, exc, render)
        except Disconnected:
            return
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            error = RLServeError(f"internal error: {type(exc).__name__}; see the server log")
            await self._answer_error(exchange, error, render)
        if self.access_log:
            seconds = time.monotonic() - exchange.call.received_at
            log_exchange(scope, exchange.call.request_id, exchange.status, seconds)

    def route(self, call: Call, model: str | None, version: int | None, action: str) -> Admitted:
        """The language model a call names (None: the default model) and its deadline; not
        yet admitted (:meth:`admit`). A model of another kind is NotFound for ``action``."""
        route = self.router.resolve(model, version)
        call.model, call.version = route.model, route.version.version
        scheduler, served = route.scheduler, route.version
        if not isinstance(scheduler, ContinuousBatchScheduler) or not isinstance(
            served, LanguageModel
        ):
            raise NotFound(
                f"model {route.model!r} is not a language model: it has no {action} route; "
                f"POST /v1/models/{route.model}/predict with observations"
            )
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
    def admit(admitted: Admitted, spent_on: str) -> None:
        """Refuse a call whose deadline passed (504) or that the queue has no room for
        (429), before any work in proportion to it."""
        admitted.deadline.check(spent_on)
        admitted.scheduler.admit(1, admitted.deadline.at)

    @staticmethod
    async def prepare(exchange: Exchange, prepare: Callable[[Spec], Work], spec: Spec) -> Work:
        """Tokenize on the event loop, or on a worker thread for a large body."""
        if exchange.large:
            return await asyncio.to_thread(prepare, spec)
        return prepare(spec)

    async def submit(
        self, exchange: Exchange, admitted: Admitted, spec: GenerationSpec, *, tokens: bool
    ) -> GenerationStream:
        """Tokenize a generation on the version it was routed to and queue it (``tokens``:
        its token events are wanted)."""
        generation = await self.prepare(exchange, admitted.version.prepare_generation, spec)
        admitted.deadline.check("validating it")
        return admitted.scheduler.submit_generation(generation, admitted.pinned, tokens=tokens)

    def refused(self, call: Call, error: RLServeError, status: int) -> None:
        """Count a call answered with an error (before or during its stream)."""
        seconds = time.monotonic() - call.received_at
        self.metrics.refused(call.model, call.version, status, error.code.value, seconds)

    async def _answer_error(
        self, exchange: Exchange, error: RLServeError, render: Callable[[RLServeError], ErrorAnswer]
    ) -> None:
        if exchange.started:  # a stream already answered 200: nothing more to say
            return
        answer = render(error)
        self.refused(exchange.call, error, answer.status)
        headers = [(k.lower().encode(), v.encode()) for k, v in http_headers(error).items()]
        await exchange.json(answer.status, answer.body, headers)


async def next_events(stream: GenerationStream) -> list[TokenEvent]:
    """The stream's next token event and those already behind it (written together);
    StopAsyncIteration at its end, the error that ended it otherwise."""
    return [await anext(stream), *stream.drain()]


def stamp(version: int, sha256: str) -> list[tuple[bytes, bytes]]:
    """The headers that say which version computed an answer."""
    return [(b"x-policy-version", str(version).encode()), (b"x-policy-sha256", sha256.encode())]
