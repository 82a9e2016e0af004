"""JSON on the wire, for both planes: bodies in (size-limited, orjson), answers out.

No per-element validation happens here: bodies are parsed with orjson into Python values,
which the model's compiled validator (``serve.policies.validation``) turns into arrays.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from serve.errors import MalformedRequest, PayloadTooLarge, RLServeError
from serve.status import http_headers, http_status

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_JSON = "application/json"
JOIN_INLINE_BYTES = 1 << 20  # larger control-plane bodies are put together off the loop


def decode_object(body: bytes) -> dict[str, Any]:
    """A JSON object from a request body, or MalformedRequest saying what is wrong."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise MalformedRequest(
            f'request body must be a JSON object like {{"observations": [...]}}, '
            f"got a JSON {type(payload).__name__}"
        )
    return payload


def too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"request body of {size} bytes exceeds the limit of {limit} bytes (max_body_bytes for "
        "predictions, max_model_bytes for pushed models); send less or raise the limit"
    )


def timeout_header_ms(header: str | None) -> float | None:
    """What an X-Request-Timeout-Ms header asks for (None: no header); MalformedRequest
    unless it is a positive number of milliseconds (``serve.dataplane.deadline`` applies it)."""
    if header is None:
        return None
    asked = positive_number(header)
    if asked is None:
        raise MalformedRequest(
            f"X-Request-Timeout-Ms: expected a positive number of milliseconds, got {header!r}"
        )
    return asked


def positive_number(text: str) -> float | None:
    """The positive, finite number ``text`` writes (a header, a query parameter), or None."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number > 0 and math.isfinite(number) else None


# --------------------------------------------------------------------------- control plane


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
