"""Ids a client names things by: a recurrent policy's sequences, a feature view's entities.

One rule for both: a string of 1 to :data:`MAX_CHARACTERS` characters, or an integer >= 0
(JSON's, or numpy's from a binary tensor), so a client may use its own keys or counters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernel.errors import InvalidInput
from kernel.json_shown import json_shown

MAX_CHARACTERS = 128


def identifier(value: Any, field: str, what: str) -> str | int:
    """``value`` as an id; InvalidInput naming ``field`` and saying what ``what`` may be."""
    if isinstance(value, str) and 0 < len(value) <= MAX_CHARACTERS:
        return value
    if isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise InvalidInput(
        f"{field}: expected {what} (a string of 1 to {MAX_CHARACTERS} characters, or an "
        f"integer >= 0), got {json_shown(value)}"
    )
