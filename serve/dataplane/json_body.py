"""Decoding a JSON predict body, with its observations straight into an array when it can.

Observations are the bulk of a body: 376 floats for a humanoid, 28,224 integers for a
stack of Atari frames. Parsing them into Python lists (orjson) and converting those to an
array costs more than the model itself for small policies. :class:`PredictBodyDecoder`
parses with simdjson instead and, when the observations are a rectangular array of
numbers, copies them in one step into a flat buffer (int64 when every number is an
integer, else float64), shaped by the nesting it verified:

- the body is an object whose keys are all predict fields, without ``actions`` (scoring
  requests are rare; they take the general path); a key given twice is refused (400), not
  silently the last one;
- ``observations`` is an array whose every nested array has the length its level's first
  array has, down to arrays of numbers only;
- counting every ``[`` in the body proves there is no nesting the lengths did not see.

Anything else, a malformed body included, is decoded by orjson into Python values
exactly as before, so errors and edge cases keep one behaviour. Either way the result is
the body as a dict whose ``observations`` is an ``np.ndarray`` or Python lists; the
model's validator accepts both.

One parser serves the event loop: simdjson reuses its buffers between documents, and
refuses to parse while a value of the previous document is still referenced, so every
value is copied out before :meth:`decode` returns.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import simdjson

from serve.dataplane.wire import decode_object
from serve.errors import MalformedRequest

# simdjson's buffer types, integers first: an image stays integral, floats need "d".
_ARRAY_OF: dict[Literal["i", "d"], type[np.generic]] = {"i": np.int64, "d": np.float64}


class PredictBodyDecoder:
    def __init__(self, parameters: frozenset[str]) -> None:
        self._parameters = parameters  # the fields besides observations a fast body may have
        self._parser = simdjson.Parser()

    def decode(self, body: bytes) -> dict[str, Any]:
        fast = self._fast(body)
        return fast if fast is not None else decode_object(body)

    def _fast(self, body: bytes) -> dict[str, Any] | None:
        try:
            document = self._parser.parse(body)
        except (ValueError, RuntimeError):  # not JSON simdjson accepts; or a parser in use
            self._parser = simdjson.Parser()
            return None
        if not isinstance(document, simdjson.Object):
            return None
        keys = list(document.keys())
        if len(set(keys)) != len(keys):
            repeated = sorted({k for k in keys if keys.count(k) > 1})
            raise MalformedRequest(
                f"request body: the key(s) {repeated} appear more than once; give each field once"
            )
        if "observations" not in keys:
            return None
        if any(k not in self._parameters for k in keys if k != "observations"):
            return None
        return _observations_and_parameters(document, keys, body)


def _observations_and_parameters(
    document: simdjson.Object, keys: list[str], body: bytes
) -> dict[str, Any] | None:
    parameters = {k: _plain(document[k]) for k in keys if k != "observations"}
    observations = document["observations"]
    if not isinstance(observations, simdjson.Array):
        return None
    shape = _rectangular_shape(observations)
    if shape is None:
        return None
    brackets = [_brackets(v) for v in parameters.values()]
    if None in brackets:
        return None
    arrays = sum(_arrays_in(shape)) + sum(b for b in brackets if b is not None)
    if body.count(b"[") != arrays:
        return None  # nesting the lengths did not see
    flat = _numbers(observations)
    if flat is None or flat.size != math.prod(shape):
        return None
    return {"observations": flat.reshape(shape), **parameters}


def _rectangular_shape(array: simdjson.Array) -> tuple[int, ...] | None:
    """The shape of a nesting whose arrays all have their level's length, or None."""
    shape: list[int] = []
    probe: Any = array
    while isinstance(probe, simdjson.Array):
        shape.append(len(probe))
        if not shape[-1]:
            return None
        probe = probe[0]
    level: list[Any] = [array]
    for size in shape[:-1]:
        children: list[Any] = []
        for item in level:
            if not isinstance(item, simdjson.Array) or len(item) != size:
                return None
            children.extend(item)
        level = children
    if any(not isinstance(item, simdjson.Array) or len(item) != shape[-1] for item in level):
        return None
    return tuple(shape)


def _arrays_in(shape: tuple[int, ...]) -> list[int]:
    """How many arrays a rectangular nesting of this shape has, per level."""
    counts, total = [], 1
    for size in shape:
        counts.append(total)
        total *= size
    return counts


def _numbers(array: simdjson.Array) -> np.ndarray | None:
    for code, dtype in _ARRAY_OF.items():
        try:
            return np.frombuffer(array.as_buffer(of_type=code), dtype=dtype)
        except (TypeError, ValueError):  # a non-integer (try floats), or not a number at all
            continue
    return None


def _plain(value: Any) -> Any:
    """A parameter's value as Python data (the parser's values do not outlive it)."""
    if isinstance(value, simdjson.Array):
        return value.as_list()
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    return value


def _brackets(value: Any) -> int | None:
    """How many "[" a parameter's value accounts for in the body (None: leave the body to
    the general path; a well-formed request has only a list of names here)."""
    if isinstance(value, list):
        if all(isinstance(item, str) for item in value):
            return 1 + sum(item.count("[") for item in value)
        return None
    if isinstance(value, str):
        return value.count("[")
    if isinstance(value, dict):
        return None
    return 0
