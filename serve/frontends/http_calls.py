"""One HTTP call from its first byte to its last, for every data-plane HTTP frontend.

The JSON predict routes (``serve.frontends.predict.http``), the Open Inference Protocol's
REST routes (``serve.frontends.oip.rest``) and the language-model routes
(``serve.frontends.lm.calls``) each only decode their wire format and encode their answer;
:class:`HttpCalls` does the rest of a call, once:

1. the call's identity (request id, deadline header, declared length: :func:`start_call`,
   one pass over the headers); :func:`read_body` reads its body whole within a size limit;
2. the frontend's handler, which answers through the :class:`Exchange` (whole, or as chunks);
3. an error the handler raises is answered in the frontend's own shape (its ``render``), with
   the status and headers ``serve.status`` maps its code to, unless a stream already started;
   an unexpected exception is logged and answered as the one internal error;
4. every refusal is counted in the metrics; ``Connection: close`` while draining;
5. the access-log line.

:func:`stamp` is the one way an answer names the version that computed it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from starlette.types import Message, Receive, Scope, Send

from kernel.errors import MethodNotAllowed, RLServeError, internal_error, quoted
from serve.frontends.access import AccessLog, given_request_id, new_request_id
from serve.frontends.wire import too_large
from serve.metrics import Metrics
from serve.status import http_headers, http_status

log = logging.getLogger("rlserve.calls")

Headers = list[tuple[bytes, bytes]]
JSON_HEADER = (b"content-type", b"application/json")
_CLOSE_HEADER = (b"connection", b"close")

# The ASGI scope extension by which the HTTP protocol (``serve.process.protocol``) and a call
# tell each other about the call's connection: an :class:`Arrival`.
ARRIVAL = "rlserve.arrival"
# After a 429, its connection is read again only after this: the least Retry-After a 429
# gives. A client that sends again at once waits unread, and its call is judged from when
# the pause began.
READ_AGAIN_AFTER_S = 1.0


@dataclass(slots=True)
class Arrival:
    """When a call's bytes arrived (monotonic seconds), and how long its connection is to
    be left unread after its answer.

    The protocol sets ``received_at`` when it parses the call's first bytes, or to when it
    stopped reading the connection if they waited unread since; the call's deadline counts
    from then (under load a call parsed in one turn of the event loop is handled in a later
    one, and the wait is the caller's too). A call answered 429 sets
    ``read_again_after_s``."""

    received_at: float
    read_again_after_s: float = 0.0


class Responder(Protocol):
    """A connection that takes a call's whole answer now: the HTTP protocol's direct cycle
    (``serve.process.direct``), for answers written without the ASGI exchange."""

    disconnected: bool  # the client went away: the answer is not written

    def answer(self, status: int, headers: Headers, body: bytes) -> None: ...


@dataclass(slots=True)
class Call:
    """What the handler learns about a call as it goes (for its error answer and metrics)."""

    request_id: str
    received_at: float
    timeout_header: str | None = None
    episode_header: str | None = None  # X-Episode-Key: which side of a canary serves it
    declared_length: int | None = None
    model: str = ""  # the metrics label: a served model's name, once routed
    version: int | None = None


class Disconnected(Exception):
    """The client went away before its request was read: there is no one to answer."""


def start_call(scope: Scope) -> Call:
    """The call's request id, deadline and episode headers and declared length, in one pass
    over headers;
    received when the server says its bytes arrived (:class:`Arrival`), else now."""
    arrival = arrival_of(scope)
    call = Call("", time.monotonic() if arrival is None else arrival.received_at)
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            call.request_id = given_request_id(value) or ""
        elif name == b"x-request-timeout-ms":
            call.timeout_header = value.decode("latin-1")
        elif name == b"content-length" and value.isdigit():
            call.declared_length = int(value)
        elif name == b"x-episode-key":
            call.episode_header = value.decode("latin-1")
    if not call.request_id:
        call.request_id = new_request_id()
    return call


def arrival_of(scope: Mapping[str, Any]) -> Arrival | None:
    """The call's :class:`Arrival`, where its server is rlserve's HTTP protocol."""
    extensions = scope.get("extensions")
    return None if extensions is None else extensions.get(ARRIVAL)


async def read_body(receive: Receive, declared: int | None, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it is known to exceed ``limit``."""
    if declared is not None and declared > limit:
        raise too_large(declared, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit)
        if not message.get("more_body", False):
            return chunk if not chunks else b"".join([*chunks, chunk])
        chunks.append(chunk)


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An error as one frontend writes it: its HTTP status and its JSON body."""

    status: int
    body: Any


def plain_error(error: RLServeError) -> ErrorAnswer:
    """``{"error": {"code", "message"}}`` with the status its code maps to."""
    return ErrorAnswer(http_status(error), error.to_json())


def stamp(version: int, sha256: str) -> Headers:
    """The headers that say which version computed an answer."""
    return [(b"x-policy-version", str(version).encode()), (b"x-policy-sha256", sha256.encode())]


class Exchange:
    """One call's answer as it is written: status, headers, a body or event chunks."""

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, call: Call, draining: Callable[[], bool]
    ) -> None:
        self.scope, self.receive, self._send, self.call = scope, receive, send, call
        self._draining = draining
        self.status = 0
        self.started = False
        self.large = False  # its body is large: work in proportion to it goes off the loop
        self.metered = True  # its refusals count in the metrics (an inference call's do)

    async def start(self, status: int, headers: Headers) -> None:
        self.status, self.started = status, True
        headers = answer_headers(self.call, headers, self._draining())
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def chunk(self, body: bytes, *, last: bool = False) -> None:
        message: Message = {"type": "http.response.body", "body": body, "more_body": not last}
        await self._send(message)

    async def answer(self, status: int, body: bytes, headers: Headers) -> None:
        """A whole answer, already encoded; ``headers`` name its content type."""
        await self.start(status, [*headers, (b"content-length", str(len(body)).encode())])
        await self._send({"type": "http.response.body", "body": body})

    async def json(self, status: int, content: Any, headers: Headers) -> None:
        await self.answer(status, orjson.dumps(content), [*headers, JSON_HEADER])


class HttpCalls:
    """The steps every data-plane HTTP call takes around its frontend's own."""

    def __init__(
        self, metrics: Metrics, draining: Callable[[], bool], *, access_log: AccessLog | None
    ) -> None:
        self.metrics = metrics
        self.draining = draining
        self.access_log = access_log

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        handle: Callable[[Exchange], Awaitable[None]],
        render: Callable[[RLServeError], ErrorAnswer] = plain_error,
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
            await self._answer_error(exchange, unexpected(scope, exc), render)
        self.logged(scope, exchange.call, exchange.status)

    def refused(self, call: Call, error: RLServeError, status: int) -> None:
        """Count a call answered with an error (before or during its stream)."""
        seconds = time.monotonic() - call.received_at
        self.metrics.refused_error(call.model, call.version, status, error, seconds)

    async def _answer_error(
        self, exchange: Exchange, error: RLServeError, render: Callable[[RLServeError], ErrorAnswer]
    ) -> None:
        if exchange.started:  # a stream already answered 200: nothing more to say
            return
        status, headers, body = self.error_answer(
            exchange.scope, exchange.call, error, render, metered=exchange.metered
        )
        await exchange.answer(status, body, headers)

    def error_answer(
        self,
        scope: Scope,
        call: Call,
        error: RLServeError,
        render: Callable[[RLServeError], ErrorAnswer],
        *,
        metered: bool = True,
    ) -> tuple[int, Headers, bytes]:
        """An error's answer (status, headers, JSON body) as ``render`` writes it, counted
        when ``metered``; after a 429 the connection is read again only later."""
        answer = render(error)
        if metered:
            self.refused(call, error, answer.status)
        if answer.status == 429 and (arrival := arrival_of(scope)) is not None:
            arrival.read_again_after_s = READ_AGAIN_AFTER_S  # its Retry-After, at least
        return answer.status, [*error_headers(error), JSON_HEADER], orjson.dumps(answer.body)

    def answer_now(
        self,
        responder: Responder,
        scope: Scope,
        call: Call,
        answer: tuple[int, Headers, bytes],
    ) -> None:
        """A whole answer (status, headers that name its content type, body) written at once
        without the ASGI exchange, with the headers every answer has, and logged."""
        status, headers, body = answer
        length = (b"content-length", str(len(body)).encode())
        responder.answer(status, answer_headers(call, [*headers, length], self.draining()), body)
        self.logged(scope, call, status)

    def settle_now(
        self,
        responder: Responder,
        scope: Scope,
        call: Call,
        answer: Callable[[], tuple[int, Headers, bytes]],
        render: Callable[[RLServeError], ErrorAnswer],
    ) -> None:
        """Write the whole answer ``answer`` makes (a task-free call's, once its batch is
        done), or the error it raises as ``render`` writes it; anything else it raises (a
        cancelled batch too) is the one internal error."""
        try:
            made = answer()
        except RLServeError as exc:
            self.refuse_now(responder, scope, call, exc, render)
        except BaseException as exc:
            self.refuse_now(responder, scope, call, unexpected(scope, exc), render)
        else:
            self.answer_now(responder, scope, call, made)

    def refuse_now(
        self,
        responder: Responder,
        scope: Scope,
        call: Call,
        error: RLServeError,
        render: Callable[[RLServeError], ErrorAnswer],
    ) -> None:
        """An error answered at once without the ASGI exchange, as ``render`` writes it."""
        self.answer_now(responder, scope, call, self.error_answer(scope, call, error, render))

    def logged(self, scope: Scope, call: Call, status: int) -> None:
        """The access-log line of a call answered with ``status`` (when the log is on)."""
        if self.access_log is not None:
            self.access_log.add(scope, call.request_id, status, time.monotonic() - call.received_at)


def unexpected(scope: Scope, exc: BaseException) -> RLServeError:
    """An exception no step should raise, logged with its call: answered as the one
    internal error."""
    log.exception("unhandled error on %s %s", scope["method"], scope["path"], exc_info=exc)
    return internal_error(exc)


def answer_headers(call: Call, headers: Headers, draining: bool) -> Headers:
    """An answer's headers with the call's request id, and ``Connection: close`` while the
    server drains: every data-plane answer's, however it is written."""
    headers = [*headers, (b"x-request-id", call.request_id.encode("latin-1"))]
    if draining:
        headers.append(_CLOSE_HEADER)
    return headers


def allow(scope: Scope, method: str) -> None:
    """MethodNotAllowed (405) unless the call's method is ``method``: the one check of
    every data-plane route."""
    if scope["method"] != method:
        raise MethodNotAllowed(
            f"{scope['method']} {quoted(scope['path'])}: this route accepts {method} only"
        )


def error_headers(error: RLServeError) -> Headers:
    """The headers an error's code adds to its answer (Retry-After, Allow, ...)."""
    return [(k.lower().encode(), v.encode()) for k, v in http_headers(error).items()]
