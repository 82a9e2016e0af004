"""OpenAI-compatible request bodies (``/v1/completions``, ``/v1/chat/completions``) as
rlserve generate calls.

:func:`parse` checks the fields that only the OpenAI protocol has (``model``, ``n``,
``stream_options``, ``logprobs``, the fields accepted only at their neutral value) and
turns the others into the native generate fields, which ``serve.lm.requests`` checks as
for ``POST /v1/models/{model}/generate``. Errors found there name the native field; a
call's :meth:`OpenAICall.renamed` names the OpenAI field instead (``max_new_tokens`` is
``max_tokens`` here).

A completions ``prompt`` is what OpenAI's API takes: text, token ids (a list of integers),
or a list of prompts (texts or token-id lists, up to :data:`MAX_PROMPTS`), each its own
generation and its own choice (:attr:`OpenAICall.bodies`: one native generate body per
choice). ``n`` samples that many choices of each prompt (a group, as GRPO samples one):
prompt ``p``'s choice ``i`` is choice ``p * n + i``; with a ``seed``, choice ``i`` draws from
the seed derived from it and ``i`` (choice 0 from the seed itself), so each choice is
reproducible alone. The scheduler prefills a prompt once for its whole group.

Log-probs: completions' ``logprobs`` (the chosen tokens' log-probs and that many likeliest
alternatives at each position: the native ``top_logprobs``) with ``echo`` (the prompt
repeated before the completion, its tokens scored too: the first has no log-prob), as
lm-evaluation-harness asks for a loglikelihood; chat's ``logprobs`` with ``top_logprobs``.

What is refused, and why: more than :data:`MAX_CHOICES` choices, ``echo`` with ``stream``,
tools, structured output, penalties and logit biases. ``user`` is accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kernel.errors import InvalidInput
from kernel.json_shown import json_shown
from serve.lm.requests import MAX_CHOICES, choice_seed

__all__ = ["MAX_PROMPTS", "Endpoint", "OpenAICall", "Options", "parse"]

MAX_PROMPTS = 256  # prompts in one completions call (each is a queued request)


class Endpoint(StrEnum):
    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Options:
    """How the answer is written, beyond what is generated."""

    stream: bool
    include_usage: bool  # streaming: a last chunk with the token counts
    logprobs: bool  # the chosen tokens' log-probs (alternatives, echo: in the bodies)
    token_ids: bool = False  # tokens named "token_id:<id>" in the log-probs (vLLM's extension)


@dataclass(frozen=True, slots=True)
class OpenAICall:
    endpoint: Endpoint
    model: str
    bodies: tuple[dict[str, Any], ...]  # one native generate body per choice (serve.lm.requests)
    options: Options
    names: dict[str, str]  # native field name -> the OpenAI name the caller used
    listed: bool = False  # the prompt was a list of prompts: choice i's is prompt[i // n]
    n: int = 1  # choices per prompt

    def renamed(self, error: InvalidInput, index: int = 0) -> InvalidInput:
        """An error about a native field of choice ``index``'s body, naming the OpenAI
        field instead (``prompt[index]`` for a prompt of a list)."""
        field, sep, rest = error.message.partition(":")
        if not sep:
            return error
        if self.listed and (field == "prompt" or field.startswith("prompt[")):
            prompt = index // self.n
            return InvalidInput(f"prompt[{prompt}]{field.removeprefix('prompt')}:{rest}")
        name = self.names.get(field)
        if name is None:
            return error
        return InvalidInput(f"{name}:{rest}")


# Fields accepted only at the value that changes nothing, and what that value is.
_NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "best_of": (lambda v: v is None or (v == 1 and not isinstance(v, bool)), "1"),
    "suffix": (lambda v: v is None or v == "", "null"),
    "frequency_penalty": (lambda v: v is None or (v == 0 and not isinstance(v, bool)), "0"),
    "presence_penalty": (lambda v: v is None or (v == 0 and not isinstance(v, bool)), "0"),
    "logit_bias": (lambda v: v is None or v == {}, "null or {}"),
    "response_format": (lambda v: v is None or v == {"type": "text"}, '{"type": "text"}'),
    "tools": (lambda v: v is None or v == [], "null or []"),
    "tool_choice": (lambda v: v is None or v == "none", '"none"'),
}
_WHY_NOT: dict[str, str] = {
    "best_of": "this server generates one choice per request",
    "suffix": "insertion (a suffix after the completion) is not supported",
    "frequency_penalty": "penalties are not supported",
    "presence_penalty": "penalties are not supported",
    "logit_bias": "logit biases are not supported",
    "response_format": "structured output is not supported",
    "tools": "tool calls are not supported",
    "tool_choice": "tool calls are not supported",
}
# Passed on to the native generate call as they are (top_k and ignore_eos: extensions, as
# other OpenAI-compatible servers have them).
_NATIVE = ("temperature", "top_p", "top_k", "seed", "stop", "ignore_eos")
_COMMON = (
    "model", *_NATIVE, "max_tokens", "stream", "stream_options", "logprobs", "user",
    "return_tokens_as_token_ids",
)  # fmt: skip
COMPLETION_FIELDS = frozenset(
    (*_COMMON, "prompt", "n", "best_of", "echo", "suffix", "frequency_penalty",
     "presence_penalty", "logit_bias")
)  # fmt: skip
CHAT_FIELDS = frozenset(
    (*_COMMON, "messages", "max_completion_tokens", "top_logprobs", "n", "frequency_penalty",
     "presence_penalty", "logit_bias", "response_format", "tools", "tool_choice",
     "parallel_tool_calls")
)  # fmt: skip


def parse(endpoint: Endpoint, payload: dict[str, Any]) -> OpenAICall:
    """An OpenAI request body as a generate call, or InvalidInput naming the field."""
    chat = endpoint is Endpoint.CHAT
    _known(payload, CHAT_FIELDS if chat else COMPLETION_FIELDS, endpoint)
    for field, (neutral, valid) in _NEUTRAL.items():
        if field in payload and not neutral(payload[field]):
            raise InvalidInput(
                f"{field}: {json_shown(payload[field])} is not supported ({_WHY_NOT[field]}); "
                f"leave it out or send {valid}"
            )
    generate = {field: payload[field] for field in _NATIVE if payload.get(field) is not None}
    names = {"max_new_tokens": "max_tokens"}
    if chat:
        generate["messages"] = _messages(payload.get("messages"))
        budget, names["max_new_tokens"] = _chat_budget(payload)
        prompts, listed = [None], False
    else:
        prompts, listed = _prompts(payload.get("prompt"))
        budget = payload.get("max_tokens")
    if budget is not None:
        generate["max_new_tokens"] = budget
    options = _options(payload, chat=chat)
    n = _choices(payload.get("n"), len(prompts))
    top = _top_logprobs(payload, chat=chat)
    if top is not None:  # checked as the native field, named as the caller's
        generate["top_logprobs"] = top
        names["top_logprobs"] = "top_logprobs" if chat else "logprobs"
    if payload.get("echo") is not None:
        generate["echo"] = payload["echo"]
    bodies = tuple(
        _sample(generate if chat else {**generate, "prompt": p}, i)
        for p in prompts
        for i in range(n)
    )
    return OpenAICall(endpoint, _model(payload.get("model")), bodies, options, names, listed, n)


def _choices(value: Any, prompts: int) -> int:
    """``n``: the choices of each prompt."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(
            f"n: expected an integer >= 1 (choices per prompt), got {json_shown(value)}"
        )
    if value * prompts > MAX_CHOICES:
        raise InvalidInput(
            f"n: {value} choices of {prompts} prompt(s) make {value * prompts}; this server "
            f"answers at most {MAX_CHOICES} choices per call: ask for fewer"
        )
    return value


def _sample(body: dict[str, Any], index: int) -> dict[str, Any]:
    """Choice ``index`` of a group: its own seed, derived from the call's (choice 0 keeps
    it), so that each choice is reproducible alone and the choices differ."""
    seed = body.get("seed")
    if index == 0 or not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        return body  # no seed (each draws its own), or one the native check will refuse
    return {**body, "seed": choice_seed(seed, index)}


def _known(payload: dict[str, Any], fields: frozenset[str], endpoint: Endpoint) -> None:
    unknown = sorted(set(payload) - fields)
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a field this server reads on {endpoint.value} (unknown: "
            f"{unknown}); it reads {sorted(fields)}"
        )


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(
            f"model: expected the name of a served model (GET /v1/models lists them), got "
            f"{json_shown(value)}"
        )
    return value


def _prompts(value: Any) -> tuple[list[Any], bool]:
    """The prompts of a completions call, and whether they came as a list of prompts: text
    or token ids (a list of integers) is one prompt; a list of texts or of token-id lists
    is one prompt each. The prompts themselves (text, or token ids) are checked as the
    native generate's ``prompt`` (serve.lm.requests), which names what is wrong."""
    if not isinstance(value, list):
        return [value], False
    if not value:
        raise InvalidInput(
            "prompt: an empty list; give the prompt as text, as token ids (a list of "
            "integers), or a list of prompts (texts or token-id lists)"
        )
    if any(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value], False  # token ids: the native check names any that is not one
    if len(value) > MAX_PROMPTS:
        raise InvalidInput(
            f"prompt: {len(value)} prompts given; this server completes at most "
            f"{MAX_PROMPTS} prompts per call: send the rest in another call"
        )
    for index, prompt in enumerate(value):
        if prompt is None:
            raise InvalidInput(
                f"prompt[{index}]: expected a string of text or a list of token ids, got null"
            )
    return list(value), True


def _messages(value: Any) -> Any:
    """Chat messages with their content as text: a list of text parts is joined; any
    other shape goes on for serve.lm.requests to refuse, naming it."""
    if not isinstance(value, list):
        return value
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            messages.append(message)
            continue
        messages.append({**message, "content": _text_parts(message["content"], index)})
    return messages


def _text_parts(parts: list[Any], index: int) -> str:
    texts = []
    for k, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else json_shown(part)
            raise InvalidInput(
                f"messages[{index}].content[{k}]: a {kind!s} part; only text parts "
                '({"type": "text", "text": "..."}) are taken by a language model'
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidInput(
                f"messages[{index}].content[{k}].text: expected a string, got {json_shown(text)}"
            )
        texts.append(text)
    return "".join(texts)


def _chat_budget(payload: dict[str, Any]) -> tuple[Any, str]:
    """The new-token budget of a chat call and the field that gave it: max_completion_tokens
    (OpenAI's current name) or max_tokens (its former one); both only when they agree."""
    newer, older = payload.get("max_completion_tokens"), payload.get("max_tokens")
    if newer is not None and older is not None and newer != older:
        raise InvalidInput(
            f"max_completion_tokens: {json_shown(newer)} while max_tokens is {json_shown(older)}; "
            "send one of them (max_tokens is the former name of max_completion_tokens)"
        )
    if newer is not None:
        return newer, "max_completion_tokens"
    return older, "max_tokens"


def _options(payload: dict[str, Any], *, chat: bool) -> Options:
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidInput(f"stream: expected true or false, got {json_shown(stream)}")
    parallel = payload.get("parallel_tool_calls")  # no tools are called: any boolean is moot
    if chat and parallel is not None and not isinstance(parallel, bool):
        raise InvalidInput(
            f"parallel_tool_calls: expected true or false, got {json_shown(parallel)}"
        )
    include_usage = _include_usage(payload.get("stream_options"))
    if payload.get("echo") is True and stream:
        raise InvalidInput(
            "echo: the prompt is repeated only in a whole answer; send stream false (or "
            "leave echo out)"
        )
    token_ids = payload.get("return_tokens_as_token_ids")
    if token_ids is not None and not isinstance(token_ids, bool):
        raise InvalidInput(
            f"return_tokens_as_token_ids: expected true or false, got {json_shown(token_ids)}"
        )
    return Options(bool(stream), include_usage, _logprobs(payload, chat=chat), bool(token_ids))


def _include_usage(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, dict) or set(value) - {"include_usage"}:
        raise InvalidInput(
            f'stream_options: expected {{"include_usage": true or false}}, got {json_shown(value)}'
        )
    include = value.get("include_usage", False)
    if not isinstance(include, bool):
        raise InvalidInput(
            f"stream_options.include_usage: expected true or false, got {json_shown(include)}"
        )
    return include


def _logprobs(payload: dict[str, Any], *, chat: bool) -> bool:
    """Whether the chosen tokens' log-probs are wanted: chat's ``logprobs`` (true or false),
    or completions' ``logprobs`` given at all (its value is the alternatives' count)."""
    value = payload.get("logprobs")
    if not chat:
        return value is not None
    if value is not None and not isinstance(value, bool):
        raise InvalidInput(f"logprobs: expected true or false, got {json_shown(value)}")
    return bool(value)


def _top_logprobs(payload: dict[str, Any], *, chat: bool) -> Any:
    """The likeliest alternatives of each position asked for, as given (the native
    ``top_logprobs`` checks the count): chat's ``top_logprobs``, with ``logprobs: true``;
    completions' ``logprobs``."""
    if not chat:
        return payload.get("logprobs")
    top = payload.get("top_logprobs")
    if top and payload.get("logprobs") is not True:
        raise InvalidInput(
            f"top_logprobs: {json_shown(top)} alternatives are given with the chosen tokens' "
            'log-probs; send "logprobs": true with it'
        )
    return top
