"""uvicorn's HTTP protocol with read timeouts: no client holds a connection by sending slowly.

uvicorn bounds the idle time between requests on a keep-alive connection
(``timeout_keep_alive``) but not the time a client takes to send a request: a connection
that never sends, a request line and headers trickled a byte at a time (slowloris), a
``Content-Length`` larger than the body that follows, or a chunked body that never ends
would each hold a connection, and whatever the request holds, for ever. This protocol
notes when it started waiting for a request's headers and for its body (two attribute
writes per request: no timer per request); the server sweeps its connections every
``SWEEP_S`` (``serve.process.server``) and answers the overdue ones 408, then closes them:

- ``header_timeout_s``: from the connection's opening (or the first byte of a request on a
  kept-alive connection) to the end of the request's headers;
- ``body_timeout_s``: from the end of the headers to the end of the body.

It also lets the predict frontend refuse a call from its headers alone
(``PredictFrontend.refuse_early``): for a while after any 429, a call its model would
refuse is answered here, before uvicorn builds a request cycle and an ASGI task for
it, and its body is skipped as it arrives. Under overload refusals are most of the answers,
so their cost decides how much of the process is left for the requests admitted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serve.errors import RequestTimeout

log = logging.getLogger("rlserve.protocol")

SWEEP_S = 1.0

# (method, request target, headers) -> a whole HTTP answer to send instead, or None
Gate = Callable[[bytes, bytes, list[tuple[bytes, bytes]]], bytes | None]


class Reading(Enum):
    NOTHING = "nothing"  # a request is being answered, or the connection idles after one
    HEADERS = "headers"
    BODY = "body"


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """Set ``header_timeout_s`` and ``body_timeout_s`` on a subclass (``with_timeouts``)."""

    header_timeout_s = 10.0
    body_timeout_s = 10.0
    gate: Gate | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._reading, self._reading_since = Reading.HEADERS, self.loop.time()
        self._skipping = False  # the call being read was answered from its headers

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading, self._reading_since = Reading.HEADERS, self.loop.time()

    def on_headers_complete(self) -> None:
        self._reading, self._reading_since = Reading.BODY, self.loop.time()
        if self.gate is not None and self._between_calls():
            answer = self.gate(self.parser.get_method(), self.url, self.headers)
            if answer is not None:
                self._skipping = True
                self.transport.write(answer)
                if not self.parser.should_keep_alive():
                    self.transport.close()
                return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._skipping:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._skipping:  # its answer is out: wait for the next call (or keep-alive end)
            self._skipping = False
            self._reading, self._reading_since = Reading.HEADERS, self.loop.time()
            return
        super().on_message_complete()
        self._reading = Reading.NOTHING

    def _between_calls(self) -> bool:
        """No call is being answered on this connection (an early answer then goes out in
        order) and it speaks HTTP/1.1."""
        idle = self.cycle is None or self.cycle.response_complete
        return idle and not self.pipeline and self.parser.get_http_version() == "1.1"

    def check_timeouts(self, now: float) -> None:
        """Answer 408 and close when the request being read is overdue."""
        reading = getattr(self, "_reading", Reading.NOTHING)
        if reading is Reading.NOTHING or self.transport.is_closing():
            return
        limit = self.header_timeout_s if reading is Reading.HEADERS else self.body_timeout_s
        if now - self._reading_since <= limit:
            return
        self._reading = Reading.NOTHING
        error = RequestTimeout(
            f"the request's {reading.value} did not arrive within {limit:g} s "
            f"({'header' if reading is Reading.HEADERS else 'body'}_timeout_s); "
            "send the whole request at once"
        )
        log.debug("closing %s: %s", self.client, error.message)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the application's receive() says so
            self.cycle.message_event.set()
            if self.cycle.response_started:
                self.transport.close()
                return
        body = orjson.dumps(error.to_json())
        head = (
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        self.transport.write(head + body)
        self.transport.close()


def configured(
    header_timeout_s: float, body_timeout_s: float, gate: Gate | None
) -> type[TimedHttpToolsProtocol]:
    """The protocol class for a server with these read timeouts and this early gate."""
    return type(
        "TimedHttpToolsProtocol",
        (TimedHttpToolsProtocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, "gate": gate},
    )
