"""What every HTTP frontend shares of the wire: a JSON object decoded from a body, the 413
error, the ``X-Request-Timeout-Ms`` header, and orjson's options for answers.

No per-element validation happens here: bodies are parsed with orjson into Python values,
which the model's compiled validator turns into arrays. The control plane reads and answers
its own bodies with these (``serve.control.http_bodies``).
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from kernel.errors import MalformedRequest, PayloadTooLarge
from serve.frontends.json_keys import refuse_repeated_keys

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def decode_object(body: bytes) -> dict[str, Any]:
    """A JSON object from a request body, or MalformedRequest saying what is wrong (a key
    given twice included: ``serve.frontends.json_keys``)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise MalformedRequest(
            f'request body must be a JSON object like {{"observations": [...]}}, '
            f"got a JSON {type(payload).__name__}"
        )
    refuse_repeated_keys(body, payload)
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
