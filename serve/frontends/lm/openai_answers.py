"""OpenAI-compatible answers: completion and chat-completion bodies, their streamed chunks,
errors, and the model list, in the shapes the official ``openai`` client reads.

Every answer names the rlserve model (``model``) and the version that generated it
(``system_fingerprint``: ``rlserve-<model>-v<version>``). Log-probs are those of the
chosen tokens (the model's own, temperature 1); each token's text is what it adds to the
decoded text (empty while a character's bytes are incomplete: the next token carries it).
The likeliest alternatives at each position, when asked for, are each token's own text
(special tokens shown as theirs) with its log-prob, likeliest first (completions: a
``{text: log-prob}`` object, as OpenAI's legacy API writes it). With
``return_tokens_as_token_ids`` (vLLM's extension) every token in the log-probs, chosen or
alternative, is named ``token_id:<id>`` instead, so a client gets the exact ids; offsets
still count the text. A chosen special token (an EOS) adds no text but is named by its own
(``</s>``), so it cannot be taken for an incomplete character's piece. With ``echo`` the prompt
comes first, in the text and in the log-probs (its first token has none: ``null``).
Errors are ``{"error": {"message", "type", "param", "code"}}``: ``code`` is rlserve's
error code (``model_not_found`` for an unknown model, as OpenAI says it), ``param`` the
field at fault when the message names one, and a request that does not fit (rlserve's 422)
is a 400, as OpenAI answers it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel.errors import ErrorCode, RLServeError
from kernel.lm.sampling import Alternatives
from serve.frontends.http_calls import ErrorAnswer
from serve.frontends.lm.openai_requests import Endpoint
from serve.lm.messages import GenerationResult, TokenEvent
from serve.lm.text import Detokenizer, TextCodec
from serve.status import http_status

__all__ = ["Answer", "error", "fingerprint", "model_list"]

_PARAM_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz_.[]0123456789")


def fingerprint(model: str, version: int) -> str:
    return f"rlserve-{model}-v{version}"


@dataclass(slots=True)
class _ChoiceText:
    """What one choice's streamed chunks carried so far."""

    detokenizer: Detokenizer | None = None  # its tokens' texts, for their log-probs
    offset: int = 0  # completions: characters so far
    first: bool = True  # chat: the role not yet sent


@dataclass(slots=True)
class Answer:
    """One call's answer, whole (:meth:`body`) or as chunks (:meth:`chunks`,
    :meth:`finished`, :meth:`end`): one choice per prompt, ``index`` 0..choices-1."""

    endpoint: Endpoint
    request_id: str
    created: int  # unix seconds
    model: str
    logprobs: bool
    include_usage: bool = False
    codec: TextCodec | None = None  # tokens' texts for their log-probs (and echo)
    choices: int = 1
    top_logprobs: int = 0  # likeliest alternatives per position (with logprobs)
    echo: bool = False  # completions: the prompt before the completion
    token_ids: bool = False  # tokens named "token_id:<id>" in the log-probs, not by text
    n: int = 1  # choices per prompt: a prompt's tokens are counted once for its group
    _texts: list[_ChoiceText] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._texts = [_ChoiceText() for _ in range(self.choices)]

    @property
    def id(self) -> str:
        prefix = "chatcmpl-" if self.endpoint is Endpoint.CHAT else "cmpl-"
        return prefix + self.request_id

    @property
    def chat(self) -> bool:
        return self.endpoint is Endpoint.CHAT

    # ------------------------------------------------------------------ whole

    def body(self, results: Sequence[GenerationResult]) -> dict[str, Any]:
        """The whole answer: a choice per result, in order; the head names the first's
        version (a call's prompts queue together, so they run on one version)."""
        choices = []
        for index, result in enumerate(results):
            ids: list[int] = []
            pieces: list[str] = []
            log_probs: list[float | None] = []
            tops: list[Alternatives | None] = []
            if self.echo and result.prompt is not None:
                prompt = result.prompt
                ids += prompt.token_ids
                pieces += self._pieces(prompt.token_ids)
                log_probs += [None, *prompt.log_probs]
                tops += [None, *(prompt.top or [()] * len(prompt.log_probs))]
            echoed = "".join(pieces)
            logprobs = None
            if self.logprobs:
                ids += result.token_ids
                pieces += self._pieces(result.token_ids)
                log_probs += result.log_probs
                tops += result.top or [()] * len(result.log_probs)
                logprobs = self._logprobs(self._texts[index], ids, pieces, log_probs, tops)
            choice: dict[str, Any] = {"index": index}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": result.text}
            else:
                choice["text"] = echoed + result.text
            choice |= {"logprobs": logprobs, "finish_reason": result.finish_reason.value}
            choices.append(choice)
        kind = "chat.completion" if self.chat else "text_completion"
        head = self._head(kind, results[0].version)
        return {**head, "choices": choices, "usage": usage(results, self.n)}

    # ------------------------------------------------------------------ streamed

    def chunks(
        self, version: int, events: Iterable[TokenEvent], index: int = 0
    ) -> list[dict[str, Any]]:
        """The chunks of choice ``index``'s token events: one per event that adds text (or
        whose log-prob is wanted)."""
        chunks = []
        text = self._texts[index]
        for event in events:
            if not event.text and not self.logprobs:
                continue
            logprobs = None
            if self.logprobs:
                piece = self._stream_detokenizer(text).push(event.token_id)
                logprobs = self._logprobs(
                    text, [event.token_id], [piece], [event.log_prob], [event.top]
                )
            chunks.append(self._chunk(version, index, event.text, logprobs, None))
        return chunks

    def finished(self, result: GenerationResult, index: int = 0) -> dict[str, Any]:
        """The chunk that ends choice ``index``: its finish reason."""
        return self._chunk(result.version, index, "", None, result.finish_reason.value)

    def end(self, results: Sequence[GenerationResult]) -> list[dict[str, Any]]:
        """The chunks after every choice's end: the token counts, when asked for."""
        if not self.include_usage:
            return []
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        head = self._head(kind, results[0].version)
        return [{**head, "choices": [], "usage": usage(results, self.n)}]

    def _chunk(
        self,
        version: int,
        index: int,
        text: str,
        logprobs: dict[str, Any] | None,
        finish: str | None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self.chat:
            state = self._texts[index]
            delta: dict[str, Any] = {"content": text} if text or state.first else {}
            if state.first:
                delta["role"], state.first = "assistant", False
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice |= {"logprobs": logprobs, "finish_reason": finish}
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        chunk = {**self._head(kind, version), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    # ------------------------------------------------------------------ parts

    def _head(self, kind: str, version: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": fingerprint(self.model, version),
        }

    def _pieces(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's text: what it adds to the decoded text of those before it."""
        if self.codec is None:
            return ["" for _ in token_ids]
        detokenizer = Detokenizer(self.codec)
        pieces = [detokenizer.push(token) for token in token_ids]
        if pieces:
            pieces[-1] += detokenizer.flush()
        return pieces

    def _stream_detokenizer(self, text: _ChoiceText) -> Detokenizer:
        if text.detokenizer is None:
            assert self.codec is not None
            text.detokenizer = Detokenizer(self.codec)
        return text.detokenizer

    def _logprobs(
        self,
        text: _ChoiceText,
        ids: Sequence[int],
        pieces: Sequence[str],
        log_probs: Sequence[float | None],
        tops: Sequence[Alternatives | None],
    ) -> dict[str, Any]:
        """The log-probs of these tokens (``pieces``: the text each adds), in the endpoint's
        shape; ``None`` where a token has none (an echoed prompt's first)."""
        shown = [self._name(token, piece) for token, piece in zip(ids, pieces, strict=True)]
        if self.chat:
            content = [
                {
                    "token": name,
                    "logprob": log_prob,
                    "bytes": list((piece or name).encode()),
                    "top_logprobs": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode())}
                        for t, lp in self._alternatives(top or ())
                    ],
                }
                for name, piece, log_prob, top in zip(shown, pieces, log_probs, tops, strict=True)
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for piece in pieces:
            offsets.append(text.offset)
            text.offset += len(piece)
        top_logprobs = None
        if self.top_logprobs:
            top_logprobs = [None if top is None else dict(self._alternatives(top)) for top in tops]
        return {
            "tokens": list(shown),
            "token_logprobs": list(log_probs),
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }

    def _name(self, token: int, piece: str) -> str:
        """A chosen token's name in the log-probs: the text it adds, or a special token's
        own text (an EOS adds none, but is named ``</s>``, not ``""``), or ``token_id:<id>``."""
        if self.token_ids:
            return f"token_id:{token}"
        if not piece and self.codec is not None and self.codec.is_special(token):
            return self.codec.token_text(token)
        return piece

    def _alternatives(self, top: Alternatives) -> list[tuple[str, float]]:
        """Each alternative's name (its token's text alone, special ones shown; or
        ``token_id:<id>``) and log-prob."""
        if self.token_ids:
            return [(f"token_id:{token}", log_prob) for token, log_prob in top]
        assert self.codec is not None
        return [(self.codec.token_text(token), log_prob) for token, log_prob in top]


def usage(results: Sequence[GenerationResult], n: int = 1) -> dict[str, int]:
    """The token counts of a call as the OpenAI API counts them: completions summed over
    its choices, prompts once per prompt (a group of ``n`` choices shares its prompt)."""
    prompt = sum(result.prompt_tokens for result in results[::n])
    completion = sum(len(result.token_ids) for result in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def error(failure: RLServeError) -> ErrorAnswer:
    """An error as OpenAI writes it, with the status its clients map to their exceptions."""
    status = http_status(failure)
    if failure.code is ErrorCode.INVALID_INPUT:
        status = 400  # OpenAI's status for a request that does not fit
    code, param = failure.code.value, _param(failure.message)
    if failure.code is ErrorCode.NOT_FOUND and failure.message.startswith("model "):
        code, param = "model_not_found", "model"
    body = {
        "error": {"message": failure.message, "type": _type(status), "param": param, "code": code}
    }
    return ErrorAnswer(status, body)


def _type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def _param(message: str) -> str | None:
    """The field an error message names first (``field: ...``), if it names one."""
    head, sep, _ = message.partition(":")
    if sep and head and set(head) <= _PARAM_CHARACTERS and not head[0].isdigit():
        return head
    return None


def model_list(models: Iterable[str], created: int) -> dict[str, Any]:
    """OpenAI's list of models: the language models served (what the completion routes
    take)."""
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "rlserve"}
        for name in models
    ]
    return {"object": "list", "data": data}
