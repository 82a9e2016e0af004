"""A value a client sent, written in an error message as the client wrote it: JSON.

Messages say ``got true``, ``got 0``, ``got "yes"``, ``got [1, 2]`` (what the client sent),
never Python's ``True``, ``'yes'`` or ``int 0``; a long value is named by its JSON type and
length instead, so no message grows with the request.
"""

from __future__ import annotations

import json

SHOWN_CHARACTERS = 64  # a value's JSON text up to this long is quoted whole

_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def json_shown(value: object, limit: int = SHOWN_CHARACTERS) -> str:
    """``value`` as JSON text when at most ``limit`` characters, else its JSON type and
    length (``an array of 20,001 characters``); None reads "nothing (null or missing)"."""
    if value is None:
        return "nothing (null or missing)"
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):  # not JSON data (a server-side value): as it prints
        text = str(value)
    if len(text) <= limit:
        return text
    kind = _KINDS.get(type(value), "a number" if isinstance(value, int | float) else "a value")
    return f"{kind} of {len(text):,} characters"
