"""Generate and score calls from decoded JSON objects: field names, types and ranges.

What a value means for a given model (its prompt's length against the context, the
defaults it fills in) is the version's business (``serve.lm.model``); this module checks
what holds for every model. Errors name the field, the value given and what is valid.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from enum import StrEnum
from typing import Any

from kernel.errors import InvalidInput
from kernel.json_shown import json_shown
from serve.lm.messages import GenerationSpec, ScoreSpec

__all__ = [
    "GENERATE_FIELDS",
    "MAX_CHOICES",
    "MAX_TOP_LOGPROBS",
    "SCORE_FIELDS",
    "choice_seed",
    "generation_spec",
    "generation_specs",
    "score_spec",
]

GENERATE_FIELDS = (
    "prompt", "messages", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop",
    "ignore_eos", "top_logprobs", "echo", "n",
)  # fmt: skip
SCORE_FIELDS = ("prompt", "messages", "completions", "top_logprobs")
MAX_STOP_STRINGS = 16
MAX_COMPLETIONS = 64
MAX_SEED = 2**64 - 1
MAX_TOP_LOGPROBS = 20  # likeliest alternatives per position (OpenAI's own limit on chat)
MAX_CHOICES = 256  # generations of one call (prompts times n; each is a queued request)


def generation_specs(
    payload: dict[str, Any], request_id: str, received_at: float, deadline: float
) -> list[GenerationSpec]:
    """A generate call's ``n`` generations of its prompt (a group, as GRPO samples one):
    generation ``i`` draws from :func:`choice_seed` of the call's seed (the first from the
    seed itself), so each is reproducible alone and they differ."""
    n = _integer(payload, "n", minimum=1, maximum=MAX_CHOICES) or 1
    spec = generation_spec(
        {k: v for k, v in payload.items() if k != "n"}, request_id, received_at, deadline
    )
    if spec.seed is None:
        return [spec] * n
    return [spec, *(replace(spec, seed=choice_seed(spec.seed, i)) for i in range(1, n))]


def choice_seed(seed: int, index: int) -> int:
    """Generation ``index``'s seed in a group sampled with ``seed`` (index 0 keeps it)."""
    if index == 0:
        return seed
    derived = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(derived, "big")


def generation_spec(
    payload: dict[str, Any], request_id: str, received_at: float, deadline: float
) -> GenerationSpec:
    _known(payload, GENERATE_FIELDS)
    prompt, messages = _prompt(payload, token_ids=True)
    return GenerationSpec(
        prompt,
        messages,
        _integer(payload, "max_new_tokens", minimum=1),
        _number(payload, "temperature", "a number >= 0 (0: greedy)", lambda v: v >= 0),
        _number(payload, "top_p", "a number in (0, 1]", lambda v: 0 < v <= 1),
        _integer(payload, "top_k", minimum=0),
        _integer(payload, "seed", minimum=0, maximum=MAX_SEED),
        _stop(payload.get("stop")),
        request_id,
        received_at,
        deadline,
        ignore_eos=_flag(payload, "ignore_eos"),
        top_logprobs=_top_logprobs(payload),
        echo=_flag(payload, "echo"),
    )


def score_spec(
    payload: dict[str, Any], request_id: str, received_at: float, deadline: float
) -> ScoreSpec:
    _known(payload, SCORE_FIELDS)
    prompt, messages = _prompt(payload)
    completions = payload.get("completions")
    if not isinstance(completions, list) or not completions:
        raise InvalidInput(
            f"completions: expected a non-empty list of strings to score after the prompt, "
            f"got {json_shown(completions)}"
        )
    if len(completions) > MAX_COMPLETIONS:
        raise InvalidInput(
            f"completions: {len(completions)} given; send at most {MAX_COMPLETIONS} per request"
        )
    for index, completion in enumerate(completions):
        if not isinstance(completion, str) or not completion:
            raise InvalidInput(
                f"completions[{index}]: expected a non-empty string, got {json_shown(completion)}"
            )
    return ScoreSpec(
        prompt,
        messages,
        tuple(completions),
        request_id,
        received_at,
        deadline,
        top_logprobs=_top_logprobs(payload),
    )


def _known(payload: dict[str, Any], fields: tuple[str, ...]) -> None:
    unknown = sorted(set(payload) - set(fields))
    if unknown:
        raise InvalidInput(f"unknown field(s) {unknown}; a request may have {list(fields)}")


def _prompt(
    payload: dict[str, Any], *, token_ids: bool = False
) -> tuple[Any, tuple[dict[str, Any], ...] | None]:
    """The prompt (text; with ``token_ids``, also a list of token ids) or the messages."""
    prompt, messages = payload.get("prompt"), payload.get("messages")
    if (prompt is None) == (messages is None):
        raise InvalidInput(
            "prompt, messages: give exactly one: a prompt (text) or messages (a chat: "
            '[{"role": "user", "content": "..."}])'
        )
    if messages is not None:
        return None, _messages(messages)
    if token_ids and isinstance(prompt, list):
        return _token_ids(prompt), None
    if not isinstance(prompt, str):
        valid = "a string of text or a list of token ids" if token_ids else "a string of text"
        raise InvalidInput(f"prompt: expected {valid}, got {json_shown(prompt)}")
    if not prompt:
        raise InvalidInput("prompt: empty; give at least one character of text")
    return prompt, None


def _token_ids(value: list[Any]) -> tuple[int, ...]:
    """A prompt given as token ids: integers >= 0 (the version checks them against its
    vocabulary)."""
    if not value:
        raise InvalidInput(
            "prompt: an empty list of token ids; give at least one token id, or the prompt as text"
        )
    for index, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise InvalidInput(
                f"prompt[{index}]: expected a token id (an integer >= 0), got {json_shown(token)}"
            )
    return tuple(value)


class ChatRole(StrEnum):
    """Who says a chat message: the roles OpenAI's chat API names that carry text. A chat
    template renders whatever role it is given, so any other (``root``, ``tool`` without
    tool calls) is refused rather than put in front of the model."""

    SYSTEM = "system"
    DEVELOPER = "developer"  # OpenAI's newer name for system
    USER = "user"
    ASSISTANT = "assistant"


_ROLES = frozenset(ChatRole)
_ROLES_SHOWN = ", ".join(ChatRole)


def _messages(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise InvalidInput(
            'messages: expected a non-empty list like [{"role": "user", "content": "..."}], '
            f"got {json_shown(value)}"
        )
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise InvalidInput(
                f"messages[{index}]: expected an object with role and content, "
                f"got {json_shown(message)}"
            )
        for field in ("role", "content"):
            if not isinstance(message.get(field), str):
                raise InvalidInput(
                    f"messages[{index}].{field}: expected a string, "
                    f"got {json_shown(message.get(field))}"
                )
        if message["role"] not in _ROLES:
            raise InvalidInput(
                f"messages[{index}].role: {json_shown(message['role'])} is not a chat role; "
                f"expected one of {_ROLES_SHOWN}"
            )
    return tuple(value)


def _integer(
    payload: dict[str, Any], field: str, *, minimum: int, maximum: int | None = None
) -> int | None:
    value = payload.get(field)
    if value is None:
        return None
    valid = isinstance(value, int) and not isinstance(value, bool)
    if not valid or value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise InvalidInput(f"{field}: expected an integer {bounds}, got {json_shown(value)}")
    return int(value)


def _number(payload: dict[str, Any], field: str, valid: str, check: Any) -> float | None:
    value = payload.get(field)
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not check(value):
        raise InvalidInput(f"{field}: expected {valid}, got {json_shown(value)}")
    return float(value)


def _top_logprobs(payload: dict[str, Any]) -> int:
    """The likeliest alternatives of each position wanted (0: none)."""
    return _integer(payload, "top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS) or 0


def _flag(payload: dict[str, Any], field: str) -> bool:
    value = payload.get(field, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"{field}: expected true or false, got {json_shown(value)}")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidInput(
            f"stop: expected a non-empty string or a list of them, got {json_shown(value)}"
        )
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidInput(f"stop: {len(stops)} strings given; send at most {MAX_STOP_STRINGS}")
    return tuple(stops)
