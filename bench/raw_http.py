"""The raw-protocol HTTP floor: an ``asyncio.Protocol`` with httptools, no ASGI.

It parses each request with httptools, drops its body, and writes a fixed small JSON answer
on the same keep-alive connection (pipelined requests are answered in order, as each
completes). No framework, no ASGI events or per-request objects, no routing, no model: what
HTTP costs a Python server on this event loop when nothing but the protocol runs per
request, the floor under the bare ASGI app (``bench/floor.py``) and so under any predict
path a protocol-level frontend could reach.

    .venv/bin/python -m bench.raw_http --port PORT

Prints ``ready`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import httptools

ANSWER = b'{"actions":[0.0]}'
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER
)


class RawHttp(asyncio.Protocol):
    """One connection: every complete request is answered with RESPONSE."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_complete(self) -> None:
        assert self.transport is not None
        self.transport.write(RESPONSE)
        if not self.parser.should_keep_alive():
            self.transport.close()


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(RawHttp, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.raw_http", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop  # the loop `rlserve serve` runs on when uvloop is there (loop auto)
    except ImportError:
        asyncio.run(serve(args.port))
    else:
        uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
