"""The protocol-neutral messages of language-model serving.

A frontend (the native JSON routes; an OpenAI-compatible one) decodes a call into a
:class:`GenerationSpec` or a :class:`ScoreSpec`: what the caller asked, as text (a
generation's prompt may be token ids). The model version that serves it tokenizes and
checks it into a :class:`Generation` or a :class:`Scoring`. The scheduler decodes; a
generation's stream yields a :class:`TokenEvent` per token and ends with a
:class:`GenerationResult`; a scoring ends with a :class:`ScoreResult`. Nothing here
knows a wire format.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kernel.lm.sampling import Alternatives, SamplingParams

__all__ = [
    "CompletionScore",
    "FinishReason",
    "Generation",
    "GenerationResult",
    "GenerationSpec",
    "PromptLogProbs",
    "ScoreResult",
    "ScoreSpec",
    "Scoring",
    "TokenEvent",
]


class FinishReason(StrEnum):
    STOP = "stop"  # an EOS token, or one of the caller's stop strings
    LENGTH = "length"  # max_new_tokens, or the context is full


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """A generate call as the caller wrote it: a prompt (text, or token ids) or chat
    messages, and the sampling parameters it gave (None: the version's generation
    defaults)."""

    prompt: str | tuple[int, ...] | None
    messages: tuple[dict[str, Any], ...] | None
    max_new_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: tuple[str, ...]
    request_id: str
    received_at: float  # monotonic seconds
    deadline: float  # monotonic seconds
    ignore_eos: bool = False  # run exactly max_new_tokens: EOS is a token like any other
    top_logprobs: int = 0  # the likeliest alternatives wanted at each new position
    echo: bool = False  # the prompt's own log-probs (and alternatives) are wanted too


@dataclass(frozen=True, slots=True)
class Generation:
    """A generate call checked and tokenized by one version, ready to decode."""

    spec: GenerationSpec
    version: int
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams
    eos: frozenset[int]

    @property
    def deadline(self) -> float:
        return self.spec.deadline

    @property
    def reach(self) -> int:
        """The most tokens its key/value cache can come to hold: the prompt and every new
        token but the last (which is chosen, never fed back)."""
        return len(self.prompt_ids) + self.max_new_tokens - 1

    @property
    def answer_tokens(self) -> int:
        """The most token entries its answer can carry: every new token (and, echoed, every
        prompt token), each with its alternatives."""
        echoed = len(self.prompt_ids) if self.spec.echo else 0
        return (self.max_new_tokens + echoed) * (1 + self.spec.top_logprobs)


@dataclass(frozen=True, slots=True)
class ScoreSpec:
    """A score call as the caller wrote it: a prompt or chat messages, and completions."""

    prompt: str | None
    messages: tuple[dict[str, Any], ...] | None
    completions: tuple[str, ...]
    request_id: str
    received_at: float
    deadline: float
    top_logprobs: int = 0  # the likeliest alternatives wanted at each scored position


@dataclass(frozen=True, slots=True)
class Scoring:
    """A score call tokenized by one version."""

    spec: ScoreSpec
    version: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[tuple[int, ...], ...]

    @property
    def deadline(self) -> float:
        return self.spec.deadline

    @property
    def tokens(self) -> int:
        """Tokens one forward pass over every completion processes."""
        return sum(len(self.prompt_ids) + len(c) for c in self.completion_ids)

    @property
    def answer_tokens(self) -> int:
        """The token entries its answer carries: every completion token with its
        alternatives."""
        return sum(len(c) for c in self.completion_ids) * (1 + self.spec.top_logprobs)


@dataclass(slots=True)  # not frozen: one is made per token, and a frozen one costs 4x more
class TokenEvent:
    """One generated token: its position among the new tokens, its log-prob (the model's,
    temperature 1), the text it adds (empty while a character's bytes or a possible stop
    string are incomplete), and the likeliest alternatives at its position when they were
    asked for. Nothing changes one once made."""

    index: int
    token_id: int
    log_prob: float
    text: str
    top: Alternatives = ()


@dataclass(frozen=True, slots=True)
class GenerationResult:
    model: str
    version: int
    sha256: str
    prompt_tokens: int
    token_ids: tuple[int, ...]  # an EOS included when generation stopped on one
    log_probs: tuple[float, ...]
    text: str  # special tokens left out; cut before a stop string
    finish_reason: FinishReason
    top: tuple[Alternatives, ...] = ()  # per new token, when alternatives were asked for
    prompt: PromptLogProbs | None = None  # when the prompt's log-probs were asked for (echo)


@dataclass(frozen=True, slots=True)
class PromptLogProbs:
    """A prompt's tokens scored by the model: each token's log-prob given those before it,
    and the likeliest alternatives at its position (the first token has neither)."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]  # one fewer than the tokens: from the second on
    top: tuple[Alternatives, ...]  # as log_probs, when alternatives were asked for


@dataclass(frozen=True, slots=True)
class CompletionScore:
    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]  # log p(token k | prompt + tokens before k)
    top: tuple[Alternatives, ...] = ()  # per token, when alternatives were asked for

    @property
    def total(self) -> float:
        return float(sum(self.log_probs))


@dataclass(frozen=True, slots=True)
class ScoreResult:
    model: str
    version: int
    sha256: str
    prompt_tokens: int
    scores: tuple[CompletionScore, ...]
