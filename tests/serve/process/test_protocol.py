"""The HTTP protocol under a real uvicorn server on a loopback socket: an answer goes out in
one write, a connection whose call was refused from its headers is left unread for the
refusal's pause, and data-plane calls take the direct cycle (answered now, or by a task)
with keep-alive, pipelining, streams and large bodies right."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn

from serve.frontends.predict.http import EarlyRefusal
from serve.process import protocol
from serve.process.direct import DirectCycle

pytestmark = pytest.mark.anyio

Message = MutableMapping[str, Any]
PAUSE_S = 0.4
REFUSED = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\nretry-after: 1\r\n\r\n{}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def app(
    scope: Message,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    """Three kinds of answer: with a length, streamed (no length) and empty; /dp/echo
    answers the length of the body it read, /dp/slow after a moment."""
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    if scope["path"] == "/dp/slow":
        await asyncio.sleep(0.05)
    if scope["path"].endswith("/stream"):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})
        return
    body = b"" if scope["path"] == "/empty" else b'{"a":1}'
    if scope["path"] == "/dp/echo":
        body = str(size).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Recording:
    """The connection's transport, with each write it was asked to make kept in order."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport, self.writes = transport, writes

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class Served:
    """A running server's port, each connection's protocol, its writes and its gate's asks."""

    def __init__(self) -> None:
        self.port = 0
        self.connections: list[protocol.TimedHttpToolsProtocol] = []
        self.writes: list[bytes] = []
        self.asked: list[tuple[bytes, float]] = []  # (target, received at) per call

    def gate(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        received_at: float,
    ) -> EarlyRefusal | None:
        self.asked.append((target, received_at))
        return EarlyRefusal(REFUSED, PAUSE_S) if target == b"/refuse" else None


class DataPlane:
    """Paths under /dp are the data plane's; /dp/now is answered without a task."""

    def __init__(self) -> None:
        self.now: list[bytes] = []  # the bodies of the calls answered now

    def route(self, path: str) -> str | None:
        return path if path.startswith("/dp/") else None

    def answer_now(self, scope: Any, body: bytes, cycle: DirectCycle, route: Any) -> bool:
        if route != "/dp/now":
            return False
        self.now.append(body)
        cycle.answer(200, [(b"content-length", b"2")], b"ok")
        return True


@asynccontextmanager
async def serving(data_plane: DataPlane | None = None) -> AsyncIterator[Served]:
    served = Served()
    base = protocol.configured(
        header_timeout_s=0.1, body_timeout_s=0.1, gate=served.gate, data_plane=data_plane
    )

    class Protocol(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            served.connections.append(self)
            super().connection_made(Recording(transport, served.writes))

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    served.port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=Protocol, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield served
    finally:
        server.should_exit = True
        await task


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> bytes:
    """Send a request; the answer's head and its body (by its length)."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


async def test_an_answer_with_a_length_goes_out_in_one_write_with_its_head() -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        answer = await exchange(reader, writer, get("/json"))
        after_json = list(served.writes)
        empty = await exchange(reader, writer, get("/empty"))
        writer.write(get("/json", "HEAD"))
        head = await reader.readuntil(b"\r\n\r\n")  # a length, and no body
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert answer.endswith(b'\r\n\r\n{"a":1}')
    assert after_json == [answer]  # head and body: one write
    assert empty.endswith(b"content-length: 0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    sent = [write for write in served.writes[1:] if write]  # an empty write sends nothing
    assert sent == [empty, head]  # nothing held back where no body follows


async def test_a_streamed_answer_sends_its_head_at_once() -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(get("/stream"))
        answer = await reader.readuntil(b"0\r\n\r\n")
        writer.close()
    assert b"transfer-encoding: chunked" in answer
    assert served.writes[0].endswith(b"\r\n\r\n")  # the head alone, before any chunk
    assert b"".join(served.writes) == answer


async def test_a_refused_connection_is_read_again_only_after_the_pause() -> None:
    async with serving() as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        other_reader, other_writer = await asyncio.open_connection("127.0.0.1", served.port)
        sent_at = time.monotonic()
        refused = await exchange(reader, writer, get("/refuse"))
        refused_at = time.monotonic()
        writer.write(get("/json"))  # at once, ignoring the refusal's Retry-After
        await asyncio.sleep(0.05)
        paused = served.connections[0]
        paused.check_timeouts(paused.loop.time() + 5)  # its pause is not the client's delay
        other = await exchange(other_reader, other_writer, get("/json"))  # not paused
        other_at = time.monotonic()
        head = await reader.readuntil(b"\r\n\r\n")
        served_at = time.monotonic()
        body = await reader.readexactly(7)
        writer.close()
        other_writer.close()
    assert refused == REFUSED
    assert other.endswith(b'{"a":1}')
    assert other_at - refused_at < PAUSE_S / 2
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert body == b'{"a":1}'
    assert served_at - refused_at >= PAUSE_S * 0.9  # left unread for the pause, then served
    (first, first_at), (elsewhere, elsewhere_at), (waited, waited_at) = served.asked
    assert (first, elsewhere, waited) == (b"/refuse", b"/json", b"/json")
    assert sent_at <= first_at <= waited_at <= refused_at  # judged from when the pause began
    assert elsewhere_at > refused_at  # another connection: from when its bytes came


async def test_answered_calls_leave_no_reference_cycles() -> None:
    """A cycle per call would be freed only by the collector: a young collection every few
    thousand calls, each long enough to show in the tail latency."""
    async with serving() as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        await exchange(reader, writer, get("/json"))  # the connection's own objects exist
        gc.collect()
        gc.disable()
        try:
            for _ in range(200):
                await exchange(reader, writer, get("/json"))
            cyclic = gc.collect()
        finally:
            gc.enable()
        writer.close()
    assert cyclic < 50  # 200 calls: not one cycle each


async def test_data_plane_calls_take_the_direct_cycle() -> None:
    plane = DataPlane()
    async with serving(plane) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        whole = await exchange(reader, writer, get("/dp/json"))
        direct = type(served.connections[0].cycle)
        writer.write(get("/dp/stream"))
        streamed = await reader.readuntil(b"0\r\n\r\n")
        now = await exchange(reader, writer, post("/dp/now", b"[1]"))
        control = await exchange(reader, writer, get("/json"))  # not the data plane's
        uvicorns = type(served.connections[0].cycle)
        writer.close()
    assert direct is DirectCycle
    assert uvicorns is not DirectCycle
    assert whole.startswith(b"HTTP/1.1 200 OK\r\n")
    assert whole.endswith(b'\r\n\r\n{"a":1}')
    assert whole in served.writes  # head and body: one write
    assert b"transfer-encoding: chunked" in streamed
    assert streamed.endswith(b"1\r\nb\r\n0\r\n\r\n")
    assert now.endswith(b"\r\n\r\nok")
    assert plane.now == [b"[1]"]
    assert control.endswith(b'{"a":1}')


async def test_pipelined_direct_calls_are_answered_in_order() -> None:
    async with serving(DataPlane()) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(get("/dp/slow") + post("/dp/now", b"x") + get("/dp/echo"))
        answers = [await _answer(reader) for _ in range(3)]
        writer.close()
    # a call queued behind another is started by the protocol when its turn comes: by a task
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [b'{"a":1}', b'{"a":1}', b"0"]


async def test_a_large_direct_body_is_read_as_it_comes() -> None:
    body = b"x" * 300_000  # past the protocol's high-water mark: its task reads it
    async with serving(DataPlane()) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        answer = await exchange(reader, writer, post("/dp/echo", body))
        writer.close()
    assert answer.endswith(b"\r\n\r\n300000")


async def test_a_direct_call_asking_to_close_is_closed_after_its_answer() -> None:
    async with serving(DataPlane()) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        writer.write(b"POST /dp/now HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                     b"Content-Length: 1\r\n\r\nx")  # fmt: skip
        answer = await reader.read()  # to the end: the server closed the connection
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"connection: close\r\n" in answer
    assert answer.endswith(b"ok")


async def test_direct_calls_leave_no_reference_cycles() -> None:
    async with serving(DataPlane()) as served:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        await exchange(reader, writer, get("/dp/json"))
        gc.collect()
        gc.disable()
        try:
            for i in range(200):
                await exchange(reader, writer, get("/dp/json") if i % 2 else post("/dp/now", b"x"))
            cyclic = gc.collect()
        finally:
            gc.enable()
        writer.close()
    assert cyclic < 50


def post(path: str, body: bytes) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


async def _answer(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)
