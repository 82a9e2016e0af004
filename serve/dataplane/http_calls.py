"""One HTTP call from its first byte to its last, for every data-plane HTTP frontend.

The JSON predict routes (``serve.dataplane.http``), the Open Inference Protocol's REST routes
(``serve.dataplane.oip.rest``) and the language-model routes (``serve.lm.frontends.calls``)
each only decode their wire format and encode their answer; :class:`HttpCalls` does the rest
of a call, once:

1. the call's identity (request id, deadline header, declared length: ``exchange.start_call``);
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from serve.access import log_exchange
from serve.dataplane.exchange import Call, Disconnected, start_call
from serve.errors import RLServeError, internal_error
from serve.metrics import Metrics
from serve.status import http_headers, http_status

log = logging.getLogger("rlserve.calls")

Headers = list[tuple[bytes, bytes]]
JSON_HEADER = (b"content-type", b"application/json")
_CLOSE_HEADER = (b"connection", b"close")


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
        headers = [*headers, (b"x-request-id", self.call.request_id.encode("latin-1"))]
        if self._draining():
            headers.append(_CLOSE_HEADER)
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

    def __init__(self, metrics: Metrics, draining: Callable[[], bool], *, access_log: bool) -> None:
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
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            await self._answer_error(exchange, internal_error(exc), render)
        if self.access_log:
            seconds = time.monotonic() - exchange.call.received_at
            log_exchange(scope, exchange.call.request_id, exchange.status, seconds)

    def refused(self, call: Call, error: RLServeError, status: int) -> None:
        """Count a call answered with an error (before or during its stream)."""
        seconds = time.monotonic() - call.received_at
        self.metrics.refused_error(call.model, call.version, status, error, seconds)

    async def _answer_error(
        self, exchange: Exchange, error: RLServeError, render: Callable[[RLServeError], ErrorAnswer]
    ) -> None:
        if exchange.started:  # a stream already answered 200: nothing more to say
            return
        answer = render(error)
        if exchange.metered:
            self.refused(exchange.call, error, answer.status)
        await exchange.json(answer.status, answer.body, error_headers(error))


def error_headers(error: RLServeError) -> Headers:
    """The headers an error's code adds to its answer (Retry-After, Allow, ...)."""
    return [(k.lower().encode(), v.encode()) for k, v in http_headers(error).items()]
