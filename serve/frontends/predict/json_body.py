"""Decoding a JSON predict body, with its observations straight into an array when it can.

Observations are the bulk of a body: 376 floats for a humanoid, 28,224 integers for a
stack of Atari frames. Parsing them into Python lists (orjson) and converting those to an
array costs more than the model itself for small policies. :class:`PredictBodyDecoder`
parses with simdjson instead and, when the observations are a rectangular array of
numbers, copies them in one step into a flat buffer (int64 when every number is an
integer, else float64; a body with a decimal point is read as floats first), shaped by the
nesting it verified:

- the body is an object whose keys are all predict fields, without ``actions`` (scoring
  requests are rare; they take the general path); a key given twice is refused (400,
  ``serve.frontends.wire``' answer), not silently the last one;
- ``observations`` is an array whose every nested array has the length its level's first
  array has, down to arrays of numbers only;
- counting every ``[`` in the body proves there is no nesting the lengths did not see.

Anything else, a malformed body included, is decoded by orjson into Python values
exactly as before, so errors and edge cases keep one behaviour (a key given twice in a
nested object is refused there: a fast body has no nested object); on both paths,
observations or actions nested more than :data:`MAX_DEPTH` lists deep (more axes than an
array can have) are refused (422), saying so. Either way the result is
the body as a dict whose ``observations`` is an ``np.ndarray`` or Python lists; the
model's validator accepts both.

JSON booleans are not numbers: ``true``/``false`` inside ``observations`` or ``actions``
is refused (422), though numpy and ``array.array`` would take them as 1 and 0. The fast
path needs no check (simdjson's number buffers refuse booleans, and its bodies have no
``actions``). A body orjson decodes rarely holds either word, which a search in C tells;
one that does is walked only when it holds more of them than its parameters account for
(``"deterministic": true``), and refused by the path of the first boolean in its inputs.

One parser serves the event loop: simdjson reuses its buffers between documents, and
refuses to parse while a value of the previous document is still referenced, so every
value is copied out before :meth:`decode` returns.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import simdjson

from kernel.errors import InvalidInput, quoted
from serve.frontends.wire import decode_object, repeated_keys

# The fields that hold numbers only: a JSON boolean in them is refused.
_NUMERIC = ("observations", "actions")
_SCALARS = frozenset({int, float, str, type(None)})  # what JSON decodes to, but booleans
MAX_DEPTH = 64  # numpy's most axes: lists nested deeper are no array of numbers
_FEW_BRACKETS = 8  # up to this many "[" are found one by one, more are counted


class PredictBodyDecoder:
    def __init__(self, parameters: frozenset[str]) -> None:
        # The fields besides observations a fast body may have: never an input (numbers).
        self._parameters = parameters - frozenset(_NUMERIC)
        self._parser = simdjson.Parser()

    def decode(self, body: bytes) -> dict[str, Any]:
        fast = self._fast(body)
        if fast is not None:  # numbers in simdjson's buffers: no booleans, no nested object
            return fast
        payload = decode_object(body)  # a key given twice refused, at any depth
        if b"true" in body or b"false" in body:  # rare: a search in C, over the bytes
            _refuse_booleans(payload, body)
        for name in _NUMERIC:
            _check_depth(name, payload.get(name))
        return payload

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
            raise repeated_keys(
                "request body", [k for k in dict.fromkeys(keys) if keys.count(k) > 1]
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
    if not _holds_brackets(body, arrays):
        return None  # nesting the lengths did not see
    flat = _numbers(observations, integral=b"." not in body)
    if flat is None or flat.size != math.prod(shape):
        return None
    if len(shape) > MAX_DEPTH:  # numbers only, as the general path would refuse them
        raise _too_deep("observations", len(shape))
    return {"observations": flat.reshape(shape), **parameters}


def _holds_brackets(body: bytes, expected: int) -> bool:
    """Whether ``body`` holds exactly ``expected`` "[". A few (one observation: one or two)
    are looked for one by one, each search a ``memchr``, about ten times faster than
    ``bytes.count`` over a body of numbers; many (an image's nested lists) are counted."""
    if expected > _FEW_BRACKETS:
        return body.count(b"[") == expected
    at = -1
    for _ in range(expected):
        at = body.find(b"[", at + 1)
        if at < 0:
            return False
    return body.find(b"[", at + 1) < 0


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


def _numbers(array: simdjson.Array, *, integral: bool) -> np.ndarray | None:
    """The numbers as int64 when they are all integers, else float64. A body with a
    decimal point anywhere (a search in C) is tried as floats first: simdjson refuses a
    non-integer in an integer buffer by raising, which costs more than the conversion."""
    if integral:
        try:
            return np.frombuffer(array.as_buffer(of_type="i"), dtype=np.int64)
        except (TypeError, ValueError):  # a non-integer (try floats), or not a number at all
            pass
    try:
        floats = np.frombuffer(array.as_buffer(of_type="d"), dtype=np.float64)
    except (TypeError, ValueError):  # not a number at all
        return None
    if integral or not floats[0].is_integer() or not np.array_equal(floats, np.trunc(floats)):
        return floats  # (the first number tells for almost every body of floats)
    return _numbers(array, integral=True)  # the "." was elsewhere: integers read exactly


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


def _too_deep(field: str, depth: int) -> InvalidInput:
    return InvalidInput(
        f"{field}: lists nested {depth} deep; at most {MAX_DEPTH} are taken (a batch axis and "
        "the observation's own axes)"
    )


def _check_depth(field: str, value: Any) -> None:
    """InvalidInput when lists nest more than MAX_DEPTH deep, counted along each first item
    (a deeper nesting further on is ragged, which the validator names), into objects too
    (a Dict space's keys)."""
    stack: list[tuple[str, Any]] = [(field, value)]
    while stack:
        where, item = stack.pop()
        depth = 0
        while isinstance(item, list):
            depth += 1
            if not item:
                break
            item = item[0]
        if depth > MAX_DEPTH:
            raise _too_deep(where, depth)
        if isinstance(item, dict):
            stack.extend((f"{where}[{quoted(str(k))}]", v) for k, v in item.items())


def _refuse_booleans(payload: dict[str, Any], body: bytes) -> None:
    """InvalidInput naming the first JSON boolean among the numbers of ``payload``.

    Each ``true``/``false`` of the body is one match of its word (strings may add more):
    when the booleans that are parameters' values account for every match, the inputs hold
    none, and nothing is walked.
    """
    matches = body.count(b"true") + body.count(b"false")
    given = sum(1 for k, v in payload.items() if k not in _NUMERIC and isinstance(v, bool))
    if matches <= given:
        return
    for name in _NUMERIC:
        found = _first_boolean(payload.get(name))
        if found is not None:
            where, value = found
            raise InvalidInput(
                f"{name}{where}: {'true' if value else 'false'} is a boolean; expected a "
                "number (1 for true, 0 for false)"
            )


def _first_boolean(value: Any) -> tuple[str, bool] | None:
    """Where the first boolean in nested lists and objects is (``[3][1]``, ``.key[0]``), in
    document order; without recursion (any depth orjson takes), and without a look at each
    number of a list that holds nothing else (its element types, gathered in C)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if item is True or item is False:
            return where, item
        if isinstance(item, list):
            if set(map(type, item)) <= _SCALARS:
                continue
            children = [(f"{where}[{i}]", c) for i, c in enumerate(item) if type(c) not in _SCALARS]
        elif isinstance(item, dict):
            children = [(f"{where}.{k}", c) for k, c in item.items() if type(c) not in _SCALARS]
        else:
            continue  # a number, a string, null, or an array (numbers only)
        stack.extend((child, path) for path, child in reversed(children))
    return None
