"""The HTTP floor: a bare ASGI app on uvicorn, the least a Python server on this stack pays.

It reads each request's body to its end and answers a fixed small JSON body: no framework,
no routing, no JSON parsing, no model, no metrics. Served by uvicorn with the options
``rlserve serve`` gives it (bench/servers.py), pinned to the same core, it is what HTTP
alone costs per request here, so that rlserve's figures can be read against it as well as
against the plain FastAPI peer. ``uvicorn bench.floor:app``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ANSWER = b'{"actions":[0.0]}'
_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(ANSWER)).encode()),
    ],
}
_BODY = {"type": "http.response.body", "body": ANSWER}


async def app(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
    """Every HTTP request, whatever its method and path, gets ``ANSWER`` once its body is in."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body", False):
        pass  # the body is read and dropped, as a server that parses it would read it
    await send(_START)
    await send(_BODY)


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop: each lifespan event is acknowledged at once."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
