"""The HTTP protocol under a real uvicorn server on a loopback socket: an answer goes out in
one write, and a connection whose call was refused from its headers is left unread for the
refusal's pause."""

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
    """Three kinds of answer: with a length, streamed (no length) and empty."""
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})
        return
    body = b"" if scope["path"] == "/empty" else b'{"a":1}'
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


@asynccontextmanager
async def serving() -> AsyncIterator[Served]:
    served = Served()
    base = protocol.configured(header_timeout_s=0.1, body_timeout_s=0.1, gate=served.gate)

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
