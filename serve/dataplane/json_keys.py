"""Keys given twice inside a predict body's objects: refused, never silently the last.

orjson (like most JSON parsers) keeps the last value of a key an object gives twice, so
``{"observations": {"pos": [0.1], "pos": [0.9]}}`` would be served as ``[0.9]``. The
decoder refuses a repeated top-level key (``serve.dataplane.json_body``); this module finds
one nested deeper: in a Dict observation, or in one element of a list of them.

Only a body with a nested object (more than one ``{``, a search in C) is read again, by
the standard library's parser with a hook that sees every object's pairs in order; bodies
of plain arrays, the common case, cost one ``bytes.count``.
"""

from __future__ import annotations

import json
from typing import Any

from serve.errors import InvalidInput

_SCALARS = frozenset({int, float, str, bool, type(None)})


class _Repeated(dict[str, Any]):
    """An object that gave ``keys`` more than once (its values: the last of each)."""

    keys_given_twice: list[str]


def refuse_repeated_keys(body: bytes) -> None:
    """InvalidInput naming the first nested object (in document order) that gives a key
    twice, and the key; nothing when there is none. ``body`` is a JSON object that has
    been decoded already (a body that does not parse here is left to that decoder)."""
    if body.count(b"{") < 2:
        return
    try:
        payload = json.loads(body, object_pairs_hook=_pairs)
    except (ValueError, RecursionError):
        return
    found = _first_repeated(payload)
    if found is not None:
        where, keys = found
        shown = ", ".join(json.dumps(k) for k in keys[:3])
        raise InvalidInput(
            f"{where}: the key(s) {shown} appear more than once in one object; give each key "
            "once (JSON parsers would keep only the last)"
        )


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
