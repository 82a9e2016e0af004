"""What the server needs of the tokenizer: ``tokenizer.json`` as the source tokenizer runs it,
how prompt text is encoded, the special tokens and the chat template.

``tokenizer.json`` is written from the loaded fast tokenizer's backend (so what transformers
adds at load time, a BOS post-processor for instance, is in it), and parity checks that the
``tokenizers`` library alone encodes every prompt to the ids transformers gave.
"""

from __future__ import annotations

from typing import Any

from export.errors import ExportError
from kernel.lm.contract import PromptEncoding

_PROBE = "Hello world"
_SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")


def tokenizer_json(tokenizer: Any, where: str) -> str:
    """The tokenizer in ``tokenizers.Tokenizer.from_str`` form; only fast tokenizers have one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportError(
            f"{where}: the tokenizer ({type(tokenizer).__name__}) is not a fast tokenizer and "
            "has no tokenizer.json; save the model with a fast tokenizer (tokenizer.json)"
        )
    return str(backend.to_str())


def prompt_encoding(tokenizer: Any) -> PromptEncoding:
    """with_special_tokens when encoding text adds tokens (a BOS), else plain."""
    with_special = tokenizer(_PROBE)["input_ids"]
    plain = tokenizer(_PROBE, add_special_tokens=False)["input_ids"]
    return PromptEncoding.PLAIN if with_special == plain else PromptEncoding.WITH_SPECIAL_TOKENS


def encode(tokenizer: Any, text: str, encoding: PromptEncoding) -> list[int]:
    special = encoding is PromptEncoding.WITH_SPECIAL_TOKENS
    return [int(i) for i in tokenizer(text, add_special_tokens=special)["input_ids"]]


def special_tokens(tokenizer: Any) -> dict[str, str]:
    """bos_token, eos_token, pad_token, unk_token -> their text, where set (for templates)."""
    found = {name: getattr(tokenizer, name, None) for name in _SPECIAL}
    return {name: str(token) for name, token in found.items() if token}


def chat_template(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one serves chat
        template = template.get("default")
    return template if isinstance(template, str) and template else None
