"""Choosing the next token from a row of logits, with numpy.

Greedy (``temperature`` 0, or below :data:`GREEDY_BELOW`, where dividing by it would
overflow) takes the argmax of the float32 logits, as ``transformers.generate`` does.
Sampling divides the logits by the temperature, keeps the
``top_k`` largest (0: all) and then the smallest set whose probability reaches ``top_p``,
and draws one token with the sequence's own ``numpy.random.Generator``: one uniform draw
per token, so a seed gives the same tokens whatever else shares the batch.

The log-prob reported for a chosen token is always the model's own: ``log_softmax`` of the
raw logits (temperature 1, no cut), in float64: the same number :func:`log_softmax`
gives, without building the whole distribution. A caller who asks for the likeliest
alternatives of each position gets them from :func:`log_softmax` and
:func:`top_alternatives`, and its chosen token's log-prob from the same row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "GREEDY_BELOW",
    "Position",
    "Sampler",
    "SamplingParams",
    "choose_rows",
    "chosen_log_probs",
    "greedy_rows",
]

GREEDY_BELOW = 1e-5  # a temperature this low samples the argmax anyway


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float  # 0: greedy
    top_p: float  # (0, 1]
    top_k: int  # 0: no cut
    seed: int | None  # None: fresh entropy

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


class Sampler:
    """One sequence's token chooser (its generator is its own)."""

    __slots__ = ("_rng", "params")

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._rng = None if params.greedy else np.random.default_rng(params.seed)

    @property
    def cuts(self) -> bool:
        """Whether it samples from a cut of the distribution (top-k or top-p)."""
        return self.params.top_p < 1.0 or self.params.top_k > 0

    def choose(self, logits: np.ndarray) -> int:
        """The next token from one row of logits ``[vocab]``."""
        if self._rng is None:
            return int(np.argmax(logits))
        return _sample(logits, self.params, self._rng)

    def uniform(self) -> float:
        """The next draw of this sequence's generator (sampling only)."""
        assert self._rng is not None
        return float(self._rng.random())


def choose_rows(logits: np.ndarray, samplers: list[Sampler]) -> np.ndarray:
    """The next token of every row of ``logits`` ``[rows, vocab]``, each by its own
    sampler: the same tokens as ``samplers[i].choose(logits[i])``, the common cases (greedy,
    and sampling without a cut) done for all their rows at once."""
    tokens = np.empty(len(samplers), np.int64)
    greedy = [row for row, s in enumerate(samplers) if s.params.greedy]
    if greedy:
        tokens[greedy] = np.argmax(logits[greedy], axis=-1)
    plain = [row for row, s in enumerate(samplers) if not s.params.greedy and not s.cuts]
    if plain:
        temperatures = np.asarray([samplers[row].params.temperature for row in plain])
        # _plain_cumulative's steps, for every row at once and in place (one array: these
        # rows times the vocabulary, in float64, is the largest thing a step allocates)
        cumulative = logits[plain].astype(np.float64)
        cumulative /= temperatures[:, None]
        cumulative -= cumulative.max(axis=-1, keepdims=True)
        np.exp(cumulative, out=cumulative)
        np.cumsum(cumulative, axis=-1, out=cumulative)
        draws = np.asarray([samplers[row].uniform() for row in plain]) * cumulative[:, -1]
        index = (cumulative <= draws[:, None]).sum(axis=-1)  # searchsorted, side="right"
        tokens[plain] = np.minimum(index, logits.shape[-1] - 1)
    for row, sampler in enumerate(samplers):
        if not sampler.params.greedy and sampler.cuts:
            tokens[row] = sampler.choose(logits[row])
    return tokens


class Position:
    """One position's logits ``[vocab]``, from which several sequences choose: a prompt's
    last position, shared by a group's choices. What every choice needs is computed once
    (the log-prob normaliser, and per temperature the cumulative weights of sampling
    without a cut), so each further choice costs one draw; its tokens and log-probs are
    those :meth:`Sampler.choose` and :func:`chosen_log_probs` give for the same row."""

    __slots__ = ("_cumulative", "_normaliser", "_wide", "logits")

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits
        self._wide = logits.astype(np.float64)
        top = self._wide.max()
        self._normaliser = float(top + np.log(np.exp(self._wide - top).sum()))
        self._cumulative: dict[float, np.ndarray] = {}

    def choose(self, sampler: Sampler) -> int:
        params = sampler.params
        if params.greedy or sampler.cuts:
            return sampler.choose(self.logits)
        cumulative = self._cumulative.get(params.temperature)
        if cumulative is None:
            cumulative = self._cumulative[params.temperature] = _plain_cumulative(
                self._wide / params.temperature
            )
        return _plain_draw(cumulative, sampler.uniform())

    def log_prob(self, token: int) -> float:
        """log p(token) at this position: temperature 1, no cut."""
        return float(self._wide[token] - self._normaliser)


def _plain_cumulative(scaled: np.ndarray) -> np.ndarray:
    """Sampling without a cut: the cumulative weights of ``scaled`` (no sort needed)."""
    return np.cumsum(np.exp(scaled - scaled.max()))


def _plain_draw(cumulative: np.ndarray, uniform: float) -> int:
    index = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
    return min(index, len(cumulative) - 1)


def _sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    scaled = logits.astype(np.float64) / params.temperature
    vocabulary = scaled.shape[-1]
    if params.top_p >= 1.0 and not 0 < params.top_k < vocabulary:
        return _plain_draw(_plain_cumulative(scaled), rng.random())
    if 0 < params.top_k < vocabulary:
        candidates = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
        candidates.sort()  # by token id, so the partition's order never matters
    else:
        candidates = np.arange(vocabulary)
    # Most probable first, ties by token id (a stable sort of token ids in order).
    order = candidates[np.argsort(-scaled[candidates], kind="stable")]
    if params.top_p < 1.0:
        kept = scaled[order]
        probs = np.exp(kept - kept[0])
        reach = np.cumsum(probs) / probs.sum()
        order = order[: int(np.searchsorted(reach, params.top_p, side="left")) + 1]
    return _draw(order, scaled, rng)


def _draw(tokens: np.ndarray, scaled: np.ndarray, rng: np.random.Generator) -> int:
    """One token of ``tokens`` with probability softmax(scaled) among them: one uniform draw
    placed on their cumulative weights, in the order given."""
    kept = scaled[tokens]
    cumulative = np.cumsum(np.exp(kept - kept.max()))
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(tokens[min(index, len(tokens) - 1)])


def greedy_rows(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The argmax of every row of ``logits`` ``[rows, vocab]`` and its log-prob: what
    ``choose_rows`` and ``chosen_log_probs`` give for greedy rows, in one pass (the chosen
    logit is the row's largest, so its log-prob is ``-log(sum(exp(row - max)))``)."""
    tokens = np.argmax(logits, axis=-1)
    wide = logits.astype(np.float64)
    wide -= wide.max(axis=-1, keepdims=True)
    np.exp(wide, out=wide)
    log_probs: np.ndarray = -np.log(wide.sum(axis=-1))
    return tokens, log_probs


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log softmax over the last axis, in float64."""
    wide = logits.astype(np.float64)
    shifted = wide - wide.max(axis=-1, keepdims=True)
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return result


Alternatives = tuple[tuple[int, float], ...]  # (token id, log-prob), the likeliest first


def top_alternatives(log_probs: np.ndarray, k: int) -> Alternatives:
    """The ``k`` likeliest tokens of one position's log-probs ``[vocab]``, likeliest first
    (ties: the lower id first, as ``argmax`` chooses)."""
    k = min(k, len(log_probs))
    if k <= 0:
        return ()
    top = np.argpartition(-log_probs, k - 1)[:k]
    top = top[np.lexsort((top, -log_probs[top]))]
    return tuple((int(t), float(log_probs[t])) for t in top)


def chosen_log_probs(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """log p(tokens[i] | row i) for logits ``[rows, vocab]``: float64, temperature 1."""
    wide = logits.astype(np.float64)
    chosen = wide[np.arange(len(tokens)), tokens]
    top = wide.max(axis=-1)
    wide -= top[:, None]
    np.exp(wide, out=wide)
    result: np.ndarray = chosen - top - np.log(wide.sum(axis=-1))
    return result
