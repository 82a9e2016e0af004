"""What decoding steps of a language model did: the record the metrics count.

The continuous-batching scheduler tallies its steps (newcomers prefilled, every running
sequence one token further, scorings run) on its decoding thread in a :class:`StepTally`
and hands a :class:`StepRecord` of the steps since the last one to its
:class:`GenerationSink` (``serve.metrics``) on the event loop, whenever it hands answers
over and at least every few tens of milliseconds while it decodes: the request path
touches no metric per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class StepRecord:
    model: str
    step_sequences: tuple[int, ...]  # per batched decoding call: the sequences it decoded
    cache_bytes: int  # key/value cache held after the last step, every version's batch
    new_tokens: int  # tokens generated (newcomers' first tokens included)
    prompt_tokens: int  # tokens prefilled or scored
    first_token_s: tuple[float, ...]  # per newcomer: from its arrival to its first token
    inter_token_s: tuple[float, ...]  # per running sequence: since its previous token
    answered: tuple[tuple[int, float], ...]  # (version, seconds since arrival) per answer


@dataclass
class StepTally:
    """What steps did since the last record (the decoding thread's, until it hands over)."""

    step_sequences: list[int] = field(default_factory=list)
    new_tokens: int = 0
    prompt_tokens: int = 0
    first_token_s: list[float] = field(default_factory=list)
    inter_token_s: list[float] = field(default_factory=list)
    answered: list[tuple[int, float]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.step_sequences or self.new_tokens or self.prompt_tokens or self.answered)

    def record(self, model: str, cache_bytes: int) -> StepRecord:
        return StepRecord(
            model,
            tuple(self.step_sequences),
            cache_bytes,
            self.new_tokens,
            self.prompt_tokens,
            tuple(self.first_token_s),
            tuple(self.inter_token_s),
            tuple(self.answered),
        )


class GenerationSink(Protocol):
    def accept_step(self, record: StepRecord) -> None:
        """Called on the event loop; must return quickly."""
        ...
