"""What every HTTP frontend shares of the wire: a JSON object decoded from a body with each
of its keys given once, the 413 error, the ``X-Request-Timeout-Ms`` header, and orjson's
options for answers.

No per-element validation happens here: bodies are parsed with orjson into Python values,
which the model's compiled validator turns into arrays. The control plane reads and answers
its own bodies with these (``serve.control.http_bodies``).

**Keys given twice** in one JSON object are refused on every JSON route, never silently the
last. orjson (like most JSON parsers) keeps the last value of a key an object gives twice, so
``{"observations": {"pos": [0.1], "pos": [0.9]}}`` would be served as ``[0.9]``, and
``{"max_tokens": 16, "max_tokens": 100000}`` would ask for the second. Every body decoded
from JSON (:func:`decode_object`, the ``/v2`` infer header and register bodies, the lane's
hello) passes :func:`refuse_repeated_keys`, which refuses with 400
naming the object (``inputs[0]``, ``messages[1]``, ``observations.pos``) and the key.

Most bodies cost one ``bytes.count``: every key writes exactly one ``:`` outside strings,
so a body with as many colons as its decoded objects hold keys has no key given twice
(colons inside strings only add to the count). Only a body where they differ (a key given
twice, or a colon in a string) is read again, by the standard library's parser with a hook
that sees every object's pairs in order. Counting the decoded keys skips lists whose first
element is not an object or a list (a tensor's numbers): a skipped object only makes the
counts differ, so nothing is missed.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from kernel.errors import MalformedRequest, PayloadTooLarge
from kernel.identifiers import MAX_CHARACTERS

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def decode_object(body: bytes) -> dict[str, Any]:
    """A JSON object from a request body, or MalformedRequest saying what is wrong (a key
    given twice included: :func:`refuse_repeated_keys`)."""
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


def episode_key(given: str | None, where: str = "X-Episode-Key") -> str | None:
    """The episode or client key a call names (None: none), by which a model's canary
    assigns every call of one episode to the same version; MalformedRequest unless it is
    1 to ``MAX_CHARACTERS`` characters (the rule of every id a client names)."""
    if given is None:
        return None
    if not 0 < len(given) <= MAX_CHARACTERS:
        raise MalformedRequest(
            f"{where}: expected an episode or client key of 1 to {MAX_CHARACTERS} characters "
            f"(every call of one episode names the same key), got {len(given)} characters"
        )
    return given


def positive_number(text: str) -> float | None:
    """The positive, finite number ``text`` writes (a header, a query parameter), or None."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number > 0 and math.isfinite(number) else None


# ---------------------------------------------------------------------- keys given twice

_SCALARS = frozenset({int, float, str, bool, type(None)})
_CONTAINERS = frozenset({dict, list})  # what JSON decodes to: exact types


class _Repeated(dict[str, Any]):
    """An object that gave ``keys`` more than once (its values: the last of each)."""

    keys_given_twice: list[str]


def refuse_repeated_keys(body: bytes, payload: Any) -> None:
    """MalformedRequest naming the first object (in document order) of ``body`` that gives
    a key twice, and the key; nothing when there is none. ``payload`` is what ``body``
    decoded to (a body that does not parse here is left to that decoder)."""
    if body.count(b":") == _keys_held(payload):
        return
    try:
        pairs = json.loads(body, object_pairs_hook=_pairs)
    except (ValueError, RecursionError):
        return
    found = _first_repeated(pairs)
    if found is not None:
        raise repeated_keys(*found)


def repeated_keys(where: str, keys: list[str]) -> MalformedRequest:
    """The one answer to a key given twice: where, which keys (the first three), the fix."""
    shown = ", ".join(json.dumps(k) for k in keys[:3])
    return MalformedRequest(
        f"{where}: the key(s) {shown} appear more than once in one object; give each key "
        "once (JSON parsers would keep only the last)"
    )


def _keys_held(payload: Any) -> int:
    """The keys of the decoded objects in ``payload``, those in lists of scalars left out."""
    held = 0
    stack = [payload]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            held += len(item)
            for value in item.values():
                if type(value) in _CONTAINERS:
                    stack.append(value)
        elif type(item) is list and item and type(item[0]) in _CONTAINERS:
            stack.extend(value for value in item if type(value) in _CONTAINERS)
    return held


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) == len(pairs):
        return dict(pairs)
    repeated = _Repeated(pairs)
    seen: set[str] = set()
    twice: dict[str, None] = {}  # in order, each once
    for key, _ in pairs:
        if key in seen:
            twice[key] = None
        seen.add(key)
    repeated.keys_given_twice = list(twice)
    return repeated


def _first_repeated(payload: Any) -> tuple[str, list[str]] | None:
    """Where the first object with a repeated key is (``observations[2]``,
    ``observations.pos``), without recursion, skipping lists of scalars whole."""
    stack: list[tuple[Any, str]] = [(payload, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, _Repeated):
            return where or "request body", item.keys_given_twice
        if isinstance(item, list):
            if set(map(type, item)) <= _SCALARS:
                continue
            children = [(c, f"{where}[{i}]") for i, c in enumerate(item) if type(c) not in _SCALARS]
        elif isinstance(item, dict):
            prefix = f"{where}." if where else ""
            children = [(c, f"{prefix}{k}") for k, c in item.items() if type(c) not in _SCALARS]
        else:
            continue
        stack.extend(reversed(children))
    return None
