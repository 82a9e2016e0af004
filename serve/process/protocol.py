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

An answer whose head declares its length goes out in one write with its body
(:class:`OneWrite`): uvicorn writes the head and the body separately, two system calls
where one does, and on a small answer the second costs as much as the first.

It also lets the predict frontend refuse a call from its headers alone
(``PredictFrontend.refuse_early``): for a while after any 429 or 504, a call its model
would refuse is answered here, before uvicorn builds a request cycle and an ASGI task for
it, and its body is skipped as it arrives. Under overload refusals are most of the answers,
so their cost decides how much of the process is left for the requests admitted. The
connection is then not read for the pause the refusal asks (its Retry-After), as after any
429 a call answers (``on_response_complete``, asked by ``Arrival.read_again_after_s``): a
client that sends again at once, ignoring it, would otherwise keep the process refusing it
as fast as it can. Its next call, when its bytes were already waiting as reading resumed, is
judged as having arrived when the pause began.

Every call's deadline counts from when its first bytes were parsed here (the ASGI scope
extension ``http_calls.ARRIVAL``), not from when its handler runs: under load the
calls read in one turn of the event loop are handled in the next, and that wait is the
caller's too.

A GET or POST call to a data-plane route (``RLServeApp.serves``: predict, ``/v2``, the kinds'
own) takes rlserve's lean request cycle (``serve.process.direct``) instead of uvicorn's,
unless the server's ``http_data_plane`` setting is ``asgi``.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import termios
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

import httptools
import orjson
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from kernel.errors import RequestTimeout
from serve.frontends.http_calls import ARRIVAL, Arrival, arrival_of
from serve.frontends.predict.http import EarlyRefusal
from serve.process.direct import DirectCycle

log = logging.getLogger("rlserve.protocol")

SWEEP_S = 1.0

# (method, request target, headers, received at) -> a refusal to send instead, or None
Gate = Callable[[bytes, bytes, list[tuple[bytes, bytes]], float], EarlyRefusal | None]


class DataPlane(Protocol):
    """The application's data plane, as the protocol asks it (``RLServeApp``)."""

    def route(self, path: str) -> Any | None:
        """The data-plane route ``path`` names (its calls take the direct cycle), or None."""

    def answer_now(self, scope: Any, body: bytes, cycle: DirectCycle, route: Any) -> bool:
        """Answer a call whose whole body has arrived without starting a task for it (it
        writes the answer to ``cycle`` now or when its batch is done); False when the call
        needs the application's task."""


_DIRECT_METHODS = (b"POST", b"GET")


class Reading(Enum):
    NOTHING = "nothing"  # a request is being answered, or the connection idles after one
    HEADERS = "headers"
    BODY = "body"


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """Set ``header_timeout_s`` and ``body_timeout_s`` on a subclass (``with_timeouts``)."""

    header_timeout_s = 10.0
    body_timeout_s = 10.0
    gate: Gate | None = None
    data_plane: DataPlane | None = None  # None: every call takes uvicorn's cycle
    answer_now = True  # a direct call may be answered without a task (DataPlane.answer_now)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._reading, self._reading_since = Reading.HEADERS, self.loop.time()
        self._skipping = False  # the call being read was answered from its headers
        self._paused_at: float | None = None  # not read since a refusal (monotonic s)
        self._unread_since: float | None = None  # the next call's bytes waited from then
        self._began_at = time.monotonic()  # when the call being read began to arrive
        self._body_of: DirectCycle | None = None  # a direct call whose body is arriving

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading, self._reading_since = Reading.HEADERS, self.loop.time()
        self._began_at = time.monotonic()  # the call's first bytes are read now

    def on_headers_complete(self) -> None:
        self._reading, self._reading_since = Reading.BODY, self.loop.time()
        received_at, self._unread_since = self._unread_since or self._began_at, None
        if self.gate is not None and self._between_calls():
            refusal = self.gate(self.parser.get_method(), self.url, self.headers, received_at)
            if refusal is not None:
                self._refuse(refusal)
                return
        if self.data_plane is not None and self._direct(received_at):
            return
        super().on_headers_complete()
        # ours, so a typed object rather than the dict ASGI's own extensions are
        self.scope["extensions"] = {ARRIVAL: Arrival(received_at)}  # type: ignore[dict-item]
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = OneWrite(self.transport, cycle)  # type: ignore[assignment]

    def _direct(self, received_at: float) -> bool:
        """Start (or queue behind the call being answered) a data-plane call on the direct
        cycle; False for a call uvicorn's cycle takes (another route or method, a
        ``100-continue``, an upgrade, an escaped path, a concurrency limit)."""
        parser = self.parser
        method = parser.get_method()
        if method not in _DIRECT_METHODS or self.expect_100_continue or parser.should_upgrade():
            return False
        if self.limit_concurrency is not None:
            return False
        url = httptools.parse_url(self.url)
        raw_path = url.path
        if b"%" in raw_path or not raw_path.isascii():
            return False
        path = self.root_path + raw_path.decode("ascii")
        assert self.data_plane is not None
        route = self.data_plane.route(path)
        if route is None:
            return False
        scope = self.scope
        version = parser.get_http_version()
        scope["method"] = method.decode("ascii")
        if version != "1.1":
            scope["http_version"] = version
        scope["path"] = path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = url.query or b""
        scope["extensions"] = {ARRIVAL: Arrival(received_at)}  # type: ignore[dict-item]
        existing = self.cycle
        cycle = DirectCycle(
            scope,  # type: ignore[arg-type]
            self.transport,
            self.flow,
            self.server_state.default_headers,
            route=route,
            keep_alive=version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        self.cycle = cycle  # type: ignore[assignment]
        if existing is not None and not existing.response_complete:
            self.flow.pause_reading()  # pipelined: answered after the calls ahead of it
            self.pipeline.appendleft((cycle, self.app))  # type: ignore[arg-type]
        else:
            self._body_of = cycle  # runs once its body is in (on_message_complete) or large
        return True

    def _run(self, cycle: DirectCycle) -> None:
        """A direct call whose body is in: answered now when the data plane can, else by
        the application's task."""
        if self.answer_now:
            assert self.data_plane is not None
            body = bytes(cycle.body)
            if self.data_plane.answer_now(cycle.scope, body, cycle, cycle.route):
                return
        self._start_asgi_task(cycle, self.app)  # type: ignore[arg-type]

    def _refuse(self, refusal: EarlyRefusal) -> None:
        """Answer a call from its headers, skip its body, and leave the connection unread
        for the refusal's pause."""
        self._skipping = True
        self.transport.write(refusal.answer)
        if not self.parser.should_keep_alive():
            self.transport.close()
        else:
            self._pause(refusal.read_again_after_s)

    def on_response_complete(self) -> None:
        """After uvicorn's bookkeeping, the pause a call answered 429 asked for."""
        super().on_response_complete()
        cycle = self.cycle
        if cycle is None or self.pipeline or self.transport.is_closing():
            return  # a call read behind this one is already in: nothing to hold back
        arrival = arrival_of(cycle.scope)
        if arrival is not None and arrival.read_again_after_s > 0:
            self._pause(arrival.read_again_after_s)

    def _pause(self, seconds: float) -> None:
        """Leave the connection unread for ``seconds`` (a pause under way goes on)."""
        if seconds > 0 and self._paused_at is None:
            self.flow.pause_reading()
            self._paused_at = time.monotonic()
            self.loop.call_later(seconds, self._read_again)

    def _read_again(self) -> None:
        """The pause after a refusal is over: bytes already waiting were sent during it."""
        paused_at, self._paused_at = self._paused_at, None
        if self.transport.is_closing():
            return
        if unread_bytes(self.transport):
            self._unread_since = paused_at
        self._reading_since = self.loop.time()  # the pause was ours, not the client's
        self.flow.resume_reading()

    def on_body(self, body: bytes) -> None:
        if self._skipping:
            return
        super().on_body(body)
        cycle = self._body_of
        if cycle is not None and len(cycle.body) > HIGH_WATER_LIMIT:
            self._body_of = None  # a large body: the task reads it as it comes
            self._start_asgi_task(cycle, self.app)  # type: ignore[arg-type]

    def on_message_complete(self) -> None:
        if self._skipping:  # its answer is out: wait for the next call (or keep-alive end)
            self._skipping = False
            self._reading, self._reading_since = Reading.HEADERS, self.loop.time()
            return
        super().on_message_complete()
        self._reading = Reading.NOTHING
        cycle, self._body_of = self._body_of, None
        if cycle is not None:
            self._run(cycle)

    def _between_calls(self) -> bool:
        """No call is being answered on this connection (an early answer then goes out in
        order) and it speaks HTTP/1.1."""
        idle = self.cycle is None or self.cycle.response_complete
        return idle and not self.pipeline and self.parser.get_http_version() == "1.1"

    def check_timeouts(self, now: float) -> None:
        """Answer 408 and close when the request being read is overdue."""
        reading = getattr(self, "_reading", Reading.NOTHING)
        if reading is Reading.NOTHING or self._paused_at is not None:
            return  # nothing is being read, or the server chose not to read
        if self.transport.is_closing():
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


def unread_bytes(transport: asyncio.BaseTransport) -> bool:
    """Whether bytes wait unread in the connection's socket."""
    raw = transport.get_extra_info("socket")
    if raw is None:
        return False
    pending = array.array("i", [0])
    try:
        fcntl.ioctl(raw.fileno(), termios.FIONREAD, pending, True)
    except OSError:
        return False
    return pending[0] > 0


class OneWrite:
    """A call's view of its connection: the head of an answer that declares its length is
    held until its body is written, and both go out in one write.

    uvicorn writes an answer's head when the application sends ``http.response.start`` and
    its body at ``http.response.body``; the data-plane frontends send both back to back
    (``http_calls.Exchange.answer``). A head is held only when a ``Content-Length`` says the
    body follows (not for a stream, whose head goes out at once, nor for HEAD, which has no
    body); anything else done with the connection writes a held head first.
    """

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: RequestResponseCycle) -> None:
        self._transport = transport
        self._cycle: RequestResponseCycle | None = cycle  # until the answer's head is written
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        elif self._cycle is not None and self._cycle.response_started:  # this is the head
            follows = _body_follows(self._cycle)
            self._cycle = None  # no longer needed: the cycle holds us, so no cycle is left
            if follows:
                self._head = data
                return
        self._transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        self.flush()  # whatever else is done with the connection comes after the head
        return getattr(self._transport, name)


def _body_follows(cycle: RequestResponseCycle) -> bool:
    """Whether the answer whose head is being written declares a body to follow."""
    return (
        cycle.chunked_encoding is False
        and cycle.expected_content_length > 0
        and cycle.scope["method"] != "HEAD"
    )


def configured(
    header_timeout_s: float,
    body_timeout_s: float,
    gate: Gate | None,
    data_plane: DataPlane | None = None,
    *,
    answer_now: bool = True,
) -> type[TimedHttpToolsProtocol]:
    """The protocol class for a server with these read timeouts, this early gate, and this
    data plane for the direct cycle (None: none), which answers calls without a task when
    ``answer_now``."""
    return type(
        "TimedHttpToolsProtocol",
        (TimedHttpToolsProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "gate": gate,
            "data_plane": data_plane,
            "answer_now": answer_now,
        },
    )
