"""The request cycle of a data-plane call: uvicorn's protocol, without uvicorn's ASGI cycle.

The data plane's HTTP routes (predict, ``/v2``, the kinds' own: ``RLServeApp.serves``) are
called many times a second for a few microseconds of work each, so the steps around them
are most of their cost. For those routes the HTTP protocol (``serve.process.protocol``)
builds a :class:`DirectCycle` instead of uvicorn's ``RequestResponseCycle``; the
application, its frontends and their one call pipeline (``serve.frontends.http_calls``) are
the same. It keeps what uvicorn's cycle does for these routes and drops the rest:

- an answer whose head declares its length goes out in one write with its body (uvicorn
  writes them separately: two system calls where one does); a stream is written chunked;
- no per-header validation (the data plane writes its own headers; the values it echoes
  were request headers, which the HTTP parser already refused to hold control characters),
  no uvicorn access log (rlserve writes its own), no ``asyncio.Event`` per call (a waiter
  is made only when the application waits for more body, or for the client to go);
- the ASGI semantics are kept: ``receive`` gives the body, then ``http.disconnect`` once the
  answer is out or the client went away; ``Connection: close`` closes after the answer;
  keep-alive and pipelining are the protocol's, as for every call.

The protocol starts nothing until the call's body is in (a body past uvicorn's high-water
mark starts the task at once, which reads it as it comes). Then the data plane may answer
the call without a task (``DataPlane.answer_now``: a predict call whose steps need no
waiting writes its answer with :meth:`DirectCycle.answer` when its batch is done); any
other call, and one pipelined behind another, runs the application in a task on this
cycle, as uvicorn's would.

Only GET and POST calls without ``Expect: 100-continue`` take this cycle; the setting
``http_data_plane: asgi`` turns it off (every call then takes uvicorn's cycle).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl

log = logging.getLogger("rlserve.protocol")

Headers = Iterable[tuple[bytes, bytes]]

_STATUS_LINES: dict[int, bytes] = {}
_DISCONNECT = {"type": "http.disconnect"}
_ERROR_HEAD = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n``, made once per status."""
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, reason)
    return line


class Wakeup:
    """``asyncio.Event``'s part a cycle uses, with no future until someone waits."""

    __slots__ = ("_is_set", "_waiter")

    def __init__(self) -> None:
        self._is_set = False
        self._waiter: asyncio.Future[None] | None = None

    def is_set(self) -> bool:
        return self._is_set

    def set(self) -> None:
        self._is_set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._is_set = False

    async def wait(self) -> None:
        if self._is_set:
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class DirectCycle:
    """One call's request and answer on a connection (the attributes the protocol reads and
    writes are uvicorn's cycle's: ``body``, ``more_body``, ``message_event``, ``keep_alive``,
    ``disconnected``, ``response_started``, ``response_complete``, ``scope``)."""

    __slots__ = (
        "_head",
        "_left",
        "body",
        "default_headers",
        "disconnected",
        "flow",
        "keep_alive",
        "message_event",
        "more_body",
        "on_response",
        "response_complete",
        "response_started",
        "route",
        "scope",
        "transport",
    )

    def __init__(
        self,
        scope: dict[str, Any],
        transport: asyncio.Transport,
        flow: FlowControl,
        default_headers: list[tuple[bytes, bytes]],
        *,
        route: Any,
        keep_alive: bool,
        on_response: Callable[[], None],
    ) -> None:
        self.scope = scope
        self.route = route  # the data-plane route the path matched (``RLServeApp.route``)
        self.transport = transport
        self.flow = flow
        self.default_headers = default_headers  # the server's (Date; Server when enabled)
        self.keep_alive = keep_alive
        self.on_response = on_response
        self.body = bytearray()
        self.more_body = True
        self.message_event = Wakeup()
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self._head: bytes | None = None  # held until the body it declares is written
        self._left: int | None = None  # body bytes still due (None: chunked)

    def answer(self, status: int, headers: Headers, body: bytes) -> None:
        """A whole answer, now: its head and body in one write (nothing once the client
        went away)."""
        if self.disconnected:
            return
        self._start(status, headers)
        self._body(body, more=False)

    async def run_asgi(self, app: Callable[..., Any]) -> None:
        """The application on this call (uvicorn's protocol starts it as a task)."""
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException:
            log.exception("unhandled error in the application")
            self._failed()
        else:
            if not self.response_complete and not self.disconnected:
                log.error("the application returned without completing its answer")
                self._failed()
        finally:
            self.on_response = _nothing

    def _failed(self) -> None:
        if not self.response_started and not self.transport.is_closing():
            self.transport.write(_ERROR_HEAD)
        self.transport.close()

    async def receive(self) -> dict[str, Any]:
        if not (self.disconnected or self.response_complete):
            if not self.message_event.is_set():
                self.flow.resume_reading()
                await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return _DISCONNECT
        body, self.body = bytes(self.body), bytearray()
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {message['type']}")
            self._start(message["status"], message.get("headers", ()))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"expected http.response.body, got {message['type']}")
            self._body(message.get("body", b""), more=message.get("more_body", False))
        else:
            raise RuntimeError(f"{message['type']} after the answer was complete")

    def _start(self, status: int, headers: Headers) -> None:
        self.response_started = True
        lines = [status_line(status)]
        close = False
        for name, value in (*self.default_headers, *headers):
            if name == b"content-length" and self._left is None:
                self._left = int(value)
            elif name == b"connection" and b"close" in value.lower():
                close = True
            lines += (name, b": ", value, b"\r\n")
        if close:
            self.keep_alive = False
        elif not self.keep_alive:
            lines.append(b"connection: close\r\n")
        if self._left is None:
            if status in (204, 304):
                self._left = 0
            else:
                lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        head = b"".join(lines)
        if self._left:  # a body follows: it goes out with the head
            self._head = head
        else:
            self.transport.write(head)

    def _body(self, body: bytes, *, more: bool) -> None:
        left = self._left
        if left is None:  # chunked
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            left -= len(body)
            if left < 0 or (left and not more):
                raise RuntimeError("the answer's body does not match its Content-Length")
            self._left = left
            data = body
        if self._head is not None:
            data, self._head = self._head + data, None
        if data:
            self.transport.write(data)
        if not more:
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


def _nothing() -> None:
    return None
