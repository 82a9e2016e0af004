"""A batch of sequences of one model version, decoded one step at a time (no asyncio here).

The continuous-batching scheduler drives it from its decoding thread: :meth:`DecodeBatch.
prefill` runs a newcomer's prompt alone and chooses its first token; the newcomers join the
running rows at the start of the next :meth:`DecodeBatch.step`, which feeds every row its
last token in one graph call and chooses the next. A sequence that finishes leaves at once
(its row is dropped before the next step); so does one its owner gave up on
(:meth:`DecodeBatch.drop`). The rows' cache is the decoder's :class:`~serve.lm.cache.
BatchCache`; when rows leave it says where the others now are, and the batch's own
per-row lists follow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from kernel.lm.sampling import (
    Alternatives,
    Position,
    Sampler,
    choose_rows,
    chosen_log_probs,
    greedy_rows,
    log_softmax,
    top_alternatives,
)
from serve.lm.cache import KVCache
from serve.lm.decoder import Decoder
from serve.lm.messages import PromptLogProbs, TokenEvent
from serve.lm.sequence import DecodingSequence

__all__ = ["DecodeBatch"]

Owner = TypeVar("Owner")


class DecodeBatch(Generic[Owner]):
    """Sequences decoded together, each with the owner its events go to."""

    def __init__(self, decoder: Decoder, *, tokens: int) -> None:
        """``tokens``: the key/value-cache tokens the batch may hold (``max_batch_tokens``)."""
        self.decoder = decoder
        self._cache = decoder.batch_cache(tokens)
        self._owners: list[Owner] = []
        self._sequences: list[DecodingSequence] = []
        self._samplers: list[Sampler] = []  # the running rows'
        self._tokens = np.empty(0, np.int64)  # the running rows' last tokens: the next input
        self._greedy = True  # every running row chooses greedily: one argmax for the batch
        self._alternatives: list[tuple[int, int]] = []  # (row, k) of rows that want the top k
        self._joining: list[tuple[Owner, DecodingSequence, KVCache]] = []
        # prompts prefilled since the last step: the same prompt again (a group's choices,
        # or calls close together) shares its logits and cache instead of running again
        self._prefilled: dict[tuple[int, ...], _Prefilled] = {}

    def __len__(self) -> int:
        """Sequences running or about to join."""
        return len(self._sequences) + len(self._joining)

    @property
    def nbytes(self) -> int:
        """Bytes of key/value cache held by running and joining sequences."""
        return self._cache.nbytes + sum(cache.nbytes for _, _, cache in self._joining)

    @property
    def owners(self) -> list[Owner]:
        return [*self._owners, *(owner for owner, _, _ in self._joining)]

    def prefill(self, owner: Owner, sequence: DecodingSequence) -> tuple[TokenEvent, int]:
        """Run the sequence's prompt and choose its first token; unless that ends it, it
        joins the batch at the next step. Returns the event and the prompt tokens run: 0
        when the same prompt was prefilled since the last step and is shared."""
        spec, prompt = sequence.generation.spec, sequence.generation.prompt_ids
        k, ran = spec.top_logprobs, 0
        shared = self._prefilled.get(prompt)
        if shared is None or (spec.echo and k not in shared.scored):
            positions, cache = self.decoder.prefill(prompt)
            ran = len(prompt)
            # keep the last position alone: every position's logits are the prompt's length
            # times the vocabulary (a quarter of a gigabyte for 2,048 tokens of 32,000)
            last = Position(positions[-1].copy())
            shared = self._prefilled[prompt] = _Prefilled(last, cache, {})
            if spec.echo:
                shared.scored[k] = _scored_prompt(positions, prompt, k)
        if spec.echo:
            sequence.prompt = shared.scored[k]
        last, cache = shared.last, shared.cache
        token = last.choose(sequence.sampler)
        if k:
            log_prob, top = _with_alternatives(last.logits, token, k)
            event = sequence.accept(token, log_prob, top)
        else:
            event = sequence.accept(token, last.log_prob(token))
        if sequence.finish is None:
            self._joining.append((owner, sequence, cache))
        return event, ran

    def step(self) -> list[tuple[Owner, DecodingSequence, TokenEvent]]:
        """One token for every sequence; the finished ones leave the batch."""
        self._join()
        if not self._sequences:
            return []
        sequences = self._sequences
        logits = self._cache.step(self._tokens)
        if self._greedy:  # one argmax for the whole batch
            chosen, log_probs = greedy_rows(logits)
        else:
            chosen = choose_rows(logits, self._samplers)
            log_probs = chosen_log_probs(logits, chosen)
        self._tokens = chosen
        tokens, chosen_lps = chosen.tolist(), log_probs.tolist()
        tops: list[Alternatives] = [()] * len(sequences)
        for row, k in self._alternatives:  # rows that asked for them
            chosen_lps[row], tops[row] = _with_alternatives(logits[row], tokens[row], k)
        emitted = [
            (owner, sequence, sequence.accept(token, log_prob, top))
            for owner, sequence, token, log_prob, top in zip(
                self._owners, sequences, tokens, chosen_lps, tops, strict=True
            )
        ]
        if any(s.finish is not None for s in sequences):
            self._keep([row for row, s in enumerate(sequences) if s.finish is None])
        return emitted

    def drop(self, gone: Callable[[Owner], bool]) -> list[Owner]:
        """Remove the sequences whose owner no longer wants them; returns those owners."""
        dropped = [owner for owner, _, _ in self._joining if gone(owner)]
        self._joining = [j for j in self._joining if not gone(j[0])]
        rows = [row for row, owner in enumerate(self._owners) if not gone(owner)]
        if len(rows) < len(self._owners):
            dropped += [o for o in self._owners if gone(o)]
            self._keep(rows)
        return dropped

    def _join(self) -> None:
        self._prefilled.clear()  # a step comes: later prompts run on their own
        if not self._joining:
            return
        reach = max(s.generation.reach for _, s, _ in self._joining)
        self._cache.add([cache for _, _, cache in self._joining], reach)
        self._owners += [owner for owner, _, _ in self._joining]
        joined = [sequence.last_token for _, sequence, _ in self._joining]
        self._sequences += [sequence for _, sequence, _ in self._joining]
        self._tokens = np.concatenate((self._tokens, np.asarray(joined, np.int64)))
        self._joining = []
        self._rows_changed()

    def _keep(self, rows: list[int]) -> None:
        if len(rows) == len(self._sequences):
            return
        order = self._cache.keep(rows)  # where the cache put the kept rows
        self._owners = [self._owners[r] for r in order]
        self._sequences = [self._sequences[r] for r in order]
        self._tokens = self._tokens[order]
        self._rows_changed()

    def _rows_changed(self) -> None:
        self._samplers = [s.sampler for s in self._sequences]
        self._greedy = all(s.params.greedy for s in self._samplers)
        self._alternatives = [
            (row, s.generation.spec.top_logprobs)
            for row, s in enumerate(self._sequences)
            if s.generation.spec.top_logprobs
        ]


@dataclass(slots=True)
class _Prefilled:
    """A prompt prefilled since the last step, for the next with the same prompt."""

    last: Position  # its last position's logits [vocab]: they choose the first new token
    cache: KVCache
    scored: dict[int, PromptLogProbs]  # the prompt scored (echo), by alternatives asked


def _with_alternatives(logits: np.ndarray, token: int, k: int) -> tuple[float, Alternatives]:
    """A chosen token's log-prob and its position's ``k`` likeliest alternatives, from one
    row of log-probs (so the chosen token, when it is the likeliest, shows the same number
    in both)."""
    log_probs = log_softmax(logits)
    return float(log_probs[token]), top_alternatives(log_probs, k)


def _scored_prompt(positions: np.ndarray, prompt_ids: tuple[int, ...], k: int) -> PromptLogProbs:
    """The prompt's own log-probs from its prefill's logits ``[len(prompt), vocab]``: each
    token from the second on, given those before it, and the alternatives when asked."""
    log_probs = log_softmax(positions[:-1])
    following = np.asarray(prompt_ids[1:], np.int64)
    chosen = log_probs[np.arange(len(following)), following]
    top = tuple(top_alternatives(row, k) for row in log_probs) if k else ()
    return PromptLogProbs(prompt_ids, tuple(float(v) for v in chosen), top)
