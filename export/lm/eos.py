"""The complete EOS set: every id that ends a generation, recorded explicitly.

A TRL output directory may name EOS in three places that drift apart: ``config.json``,
``generation_config.json`` (an id or a list: chat models add their end-of-turn token there)
and the tokenizer. ``transformers.generate`` stops on the generation config's ids only; the
server stops on all of them, and the exporter proves parity with that same set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.errors import ExportError


def eos_token_ids(
    config: Mapping[str, Any],
    generation: Mapping[str, Any],
    tokenizer_eos: int | None,
    vocab_size: int,
) -> list[int]:
    """The union of the three, sorted; ExportError when it is empty or out of the vocabulary."""
    found = {
        *_ids(config.get("eos_token_id"), "config.json eos_token_id"),
        *_ids(generation.get("eos_token_id"), "generation_config.json eos_token_id"),
        *([] if tokenizer_eos is None else [tokenizer_eos]),
    }
    if not found:
        raise ExportError(
            "no EOS token: config.json, generation_config.json and the tokenizer all leave "
            "eos_token_id unset, so generation would never stop; set eos_token_id in "
            "generation_config.json"
        )
    outside = sorted(i for i in found if not 0 <= i < vocab_size)
    if outside:
        raise ExportError(
            f"EOS token ids {outside} are outside the vocabulary (0..{vocab_size - 1}); fix "
            "eos_token_id in config.json or generation_config.json"
        )
    return sorted(found)


def _ids(value: object, where: str) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    ids = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(ids) != len(values):
        raise ExportError(f"{where} is {value!r}; expected a token id or a list of token ids")
    return ids
