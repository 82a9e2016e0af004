"""Text in and out of a language model: prompts and chats to token ids, token ids to text.

The tokenizer is the version's ``tokenizer.json``, read by the ``tokenizers`` library (no
transformers at serving time). A prompt is encoded as the contract's ``prompt_encoding``
says (with the special tokens the source tokenizer adds, e.g. Llama's BOS, or without); a
completion to score as its ``completion_encoding`` says. Chat messages are rendered with
the contract's Jinja ``chat_template`` in a sandboxed environment, with the special tokens
as variables and ``add_generation_prompt``, and the rendered text is encoded without
special tokens: what ``transformers``' ``apply_chat_template`` does.

Streaming text: :class:`Detokenizer` turns ids into text as they come, holding back bytes
that do not yet form a whole character; :class:`StopStrings` finds the caller's stop
strings and holds back text that might be the start of one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from kernel.errors import InvalidInput, ModelLoadError, one_line
from kernel.lm.contract import LanguageModelContract, PromptEncoding

__all__ = ["ChatMessage", "Detokenizer", "StopStrings", "TextCodec"]

ChatMessage = dict[str, Any]  # {"role": ..., "content": ...}, as the request gave it


class TextCodec:
    """One version's tokenizer, encodings and chat template."""

    def __init__(self, tokenizer: Tokenizer, contract: LanguageModelContract, origin: str) -> None:
        self.tokenizer = tokenizer
        self._prompt_specials = contract.prompt_encoding is PromptEncoding.WITH_SPECIAL_TOKENS
        self._completion_specials = (
            contract.completion_encoding is PromptEncoding.WITH_SPECIAL_TOKENS
        )
        self._special_tokens = dict(contract.special_tokens)
        self._specials = frozenset(
            token for token, added in tokenizer.get_added_tokens_decoder().items() if added.special
        )
        self._template = None
        if contract.chat_template is not None:
            environment = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
            )
            environment.filters["tojson"] = _tojson
            environment.globals["raise_exception"] = _raise
            environment.globals["strftime_now"] = _strftime_now
            try:
                self._template = environment.from_string(contract.chat_template)
            except TemplateError as exc:
                raise ModelLoadError(
                    f"{origin}: the contract's chat_template does not compile ({one_line(exc)})"
                ) from None

    @classmethod
    def load(cls, directory: Path, contract: LanguageModelContract, origin: str) -> TextCodec:
        path = directory / contract.tokenizer_file
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own exception types
            raise ModelLoadError(
                f"{origin}: cannot read the tokenizer {path.name} beside model.onnx "
                f"({one_line(exc)}); a language-model version holds model.onnx and "
                f"{contract.tokenizer_file}"
            ) from None
        vocabulary = tokenizer.get_vocab_size(with_added_tokens=True)
        if vocabulary > contract.vocab_size:
            raise ModelLoadError(
                f"{origin}: the tokenizer has {vocabulary} tokens but the model's logits have "
                f"{contract.vocab_size} (vocab_size); they do not belong together"
            )
        return cls(tokenizer, contract, origin)

    @property
    def chat(self) -> bool:
        """Whether this version renders chat messages (its contract has a chat template)."""
        return self._template is not None

    def encode_prompt(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=self._prompt_specials).ids
        return ids

    def encode_completion(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(
            text, add_special_tokens=self._completion_specials
        ).ids
        return ids

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The chat as text, ready for the assistant's answer."""
        if self._template is None:
            raise InvalidInput(
                "messages: this model has no chat template; send a plain prompt instead"
            )
        try:
            return self._template.render(
                messages=list(messages), add_generation_prompt=True, **self._special_tokens
            )
        except TemplateError as exc:
            raise InvalidInput(
                f"messages: the model's chat template refused them ({one_line(exc)})"
            ) from None

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        ids: list[int] = self.tokenizer.encode(
            self.render_chat(messages), add_special_tokens=False
        ).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def token_text(self, token: int) -> str:
        """One token's text alone, a special token's shown (an alternative's name)."""
        text: str = self.tokenizer.decode([token], skip_special_tokens=False)
        return text

    def is_special(self, token: int) -> bool:
        """Whether a token is one of the tokenizer's special ones (BOS, EOS, chat markers),
        whose text decoding leaves out."""
        return token in self._specials


class Detokenizer:
    """Text of a growing list of ids, piece by piece: each piece is what the ids added since
    the last one spell, once they spell whole characters. The pieces add up to
    ``codec.decode(ids)`` (``flush`` gives what remains).

    The work is the ``tokenizers`` library's own incremental decoder (``DecodeStream``: one
    call into Rust per token, holding back bytes of an unfinished character)."""

    __slots__ = ("_codec", "_given", "_ids", "_stream")

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._stream = DecodeStream(skip_special_tokens=True)
        self._ids: list[int] = []
        self._given = 0  # characters handed out

    def push(self, token: int) -> str:
        self._ids.append(token)
        piece: str | None = self._stream.step(self._codec.tokenizer, token)
        if not piece:
            return ""  # nothing new, or bytes of a character still to come
        self._given += len(piece)
        return piece

    def flush(self) -> str:
        """Whatever the ids spell that was not handed out yet (the whole text is the
        decoded ids; pieces that differed from it, which no common tokenizer does, are not
        taken back)."""
        whole = self._codec.decode(self._ids)
        rest = whole[self._given :]
        self._given = len(whole)
        return rest


class StopStrings:
    """The caller's stop strings in a growing text: where the first one starts, and how
    much text is safe to hand out (it cannot be the start of one)."""

    __slots__ = ("_longest", "_searched", "_stops")

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._searched = 0  # no stop string starts before this

    def __bool__(self) -> bool:
        return bool(self._stops)

    def find(self, text: str) -> int | None:
        """Where the earliest stop string starts in ``text`` (None: nowhere yet)."""
        start = max(0, self._searched - self._longest + 1)
        found = [at for at in (text.find(s, start) for s in self._stops) if at >= 0]
        self._searched = len(text)
        return min(found) if found else None

    def safe(self, text: str) -> int:
        """How much of ``text`` can be handed out: all but a tail that a stop string may
        still complete."""
        for keep in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-keep:]
            if any(s.startswith(tail) for s in self._stops):
                return len(text) - keep
        return len(text)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)
