"""The HTTP bodies of the control plane's endpoints (Starlette requests): bodies read within
a limit (413 as soon as one is known to exceed it), JSON answers and errors written with
orjson.

The data plane reads its bodies from raw ASGI messages instead (``serve.frontends.http_calls``);
what both share, decoding a JSON object and the 413 error, is ``serve.frontends.wire``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from kernel.errors import RLServeError
from serve.frontends.wire import JSON_OPTIONS, decode_object, too_large
from serve.status import http_headers, http_status

_JSON = "application/json"
JOIN_INLINE_BYTES = 1 << 20  # larger bodies are put together off the loop


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    return decode_object(await read_body(request, max_bytes))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, refused with 413 as soon as it is known to exceed ``max_bytes``."""
    chunks = [chunk async for chunk in body_chunks(request, max_bytes)]
    if sum(map(len, chunks)) > JOIN_INLINE_BYTES:  # copying it would hold the loop
        return await asyncio.to_thread(b"".join, chunks)
    return b"".join(chunks)


def body_chunks(request: Request, max_bytes: int) -> AsyncIterator[bytes]:
    """The body as it arrives; 413 at once for a declared length over ``max_bytes``, and
    as soon as the chunks received exceed it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(int(declared), max_bytes)
    return _limited(request.stream(), max_bytes)


async def _limited(chunks: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[bytes]:
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise too_large(size, max_bytes)
        yield chunk


def json_response(
    content: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(content, option=JSON_OPTIONS), status, headers, media_type=_JSON)


def error_response(error: RLServeError) -> Response:
    return json_response(error.to_json(), http_status(error), http_headers(error))
