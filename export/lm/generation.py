"""Generation defaults (what a request gets when it does not say), from generation_config.json.

Only the keys the file sets override :class:`kernel.lm.contract.GenerationDefaults`; the file
itself is copied beside the model as it was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from export.errors import ExportError
from export.lm.checkpoint import SideFile
from kernel.lm.contract import GenerationDefaults

FILE = "generation_config.json"
_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "do_sample")


def read(file: SideFile | None) -> dict[str, Any]:
    """generation_config.json as a dict ({} when the directory has none)."""
    if file is None:
        return {}
    try:
        raw = json.loads(file.data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"{file.path}: not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ExportError(f"{file.path}: expected a JSON object")
    return raw


def defaults(generation: Mapping[str, Any]) -> GenerationDefaults:
    """The file's sampling settings over the contract's defaults (top_k None means no cut)."""
    given = {key: generation[key] for key in _KEYS if generation.get(key) is not None}
    try:
        return GenerationDefaults.model_validate(given)
    except ValueError as exc:
        raise ExportError(f"{FILE}: unusable generation settings {given} ({exc})") from None
