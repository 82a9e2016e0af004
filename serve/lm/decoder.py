"""The calls a decoding engine makes of a language model's graph.

:class:`Decoder` is what the continuous-batching scheduler needs: prefill one prompt, a
batch's cache that steps its rows by one token, run whole rows for scoring.
:class:`GraphDecoder` implements it over the contract's graph interface
(``kernel.lm.contract``) with any ``feeds -> outputs`` callable (an onnxruntime session's
``run``), and a binder where the session can run over arrays in place (the CPU); tests
implement it without a graph.

Where a batch's cache lives is chosen once per decoder (:class:`CacheStorage`): in
preallocated slots grown in place when the graph writes each row's new token at the row's
own length and can be bound in place; else in arrays the graph returns grown by each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol

import numpy as np

from kernel.lm.contract import CacheLayout, LanguageModelContract
from kernel.lm.greedy import Runner
from serve.execution.runtime import Binder
from serve.lm.cache import BatchCache, CopiedCache, KVCache
from serve.lm.slots import SlotCache

__all__ = ["CacheStorage", "Decoder", "GraphDecoder"]


class CacheStorage(Enum):
    """Where a batch's key/value cache lives."""

    SLOTS = "slots"  # preallocated rows the graph grows in place (serve.lm.slots)
    COPIES = "copies"  # arrays the graph returns one column longer (serve.lm.cache)


class Decoder(Protocol):
    @property
    def vocab_size(self) -> int: ...

    def prefill(self, ids: Sequence[int]) -> tuple[np.ndarray, KVCache]:
        """One prompt in one call: the logits of every position ``[len(ids), vocab]`` (the
        last one's choose the first new token) and its cache."""
        ...

    def batch_cache(self, tokens: int) -> BatchCache:
        """An empty cache for a batch's rows, which also runs its steps; ``tokens``: the
        batch's budget (rows times the tokens each can come to hold)."""
        ...

    def forward(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Whole rows from an empty cache: logits ``[rows, longest, vocab]``; a shorter row's
        positions past its end are padding (right-padded: nothing real attends to them)."""
        ...


class GraphDecoder:
    """A :class:`Decoder` over a graph with the contract's interface."""

    def __init__(
        self, run: Runner, contract: LanguageModelContract, binder: Binder | None = None
    ) -> None:
        self._run = run
        # kept only where slots can use it: a graph that writes each row's new key and
        # value at the row's own length (a left-padded one appends a column to every row)
        sequence_lengths = contract.cache_layout is CacheLayout.SEQUENCE_LENGTHS
        self._binder = binder if sequence_lengths else None
        self._contract = contract
        self._tensors = contract.tensors
        self._past = [contract.cache_names(i)[:2] for i in range(contract.num_layers)]
        self._present = [contract.cache_names(i)[2:] for i in range(contract.num_layers)]
        self._pad = contract.pad_token_id or 0
        self._layout = contract.cache_layout

    @property
    def vocab_size(self) -> int:
        return self._contract.vocab_size

    def prefill(self, ids: Sequence[int]) -> tuple[np.ndarray, KVCache]:
        tokens = np.asarray([ids], np.int64)
        count = tokens.shape[1]
        outputs = self._call(
            tokens, np.ones((1, count), np.int64), np.arange(count, dtype=np.int64)[None, :], None
        )
        keys, values = self._cache_of(outputs)
        return outputs[self._tensors.logits][0], KVCache.of_rows(keys, values, self._layout)

    @property
    def storage(self) -> CacheStorage:
        return CacheStorage.COPIES if self._binder is None else CacheStorage.SLOTS

    def batch_cache(self, tokens: int) -> BatchCache:
        if self._binder is None:
            return self.copied_cache()
        return SlotCache(self._contract, self._binder, tokens)

    def copied_cache(self) -> CopiedCache:
        """A batch cache copied at every step, whatever the storage (the reference slots
        are tested against)."""
        return CopiedCache(self.step)

    def step(self, cache: KVCache, tokens: np.ndarray) -> tuple[np.ndarray, KVCache]:
        """One new token per row of ``cache``: logits ``[rows, vocab]`` and a copy of the
        cache grown by the new tokens."""
        mask, positions = cache.step_inputs()
        outputs = self._call(np.asarray(tokens, np.int64).reshape(-1, 1), mask, positions, cache)
        keys, values = self._cache_of(outputs)
        return outputs[self._tensors.logits][:, -1], cache.grown(keys, values, mask)

    def forward(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        longest = max(len(r) for r in rows)
        tokens = np.full((len(rows), longest), self._pad, np.int64)
        mask = np.zeros((len(rows), longest), np.int64)
        for index, row in enumerate(rows):
            tokens[index, : len(row)] = row
            mask[index, : len(row)] = 1
        positions = np.broadcast_to(np.arange(longest, dtype=np.int64), tokens.shape).copy()
        logits: np.ndarray = self._call(tokens, mask, positions, None)[self._tensors.logits]
        return logits

    def _call(
        self,
        tokens: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        cache: KVCache | None,
    ) -> dict[str, np.ndarray]:
        t = self._tensors
        feeds = {t.input_ids: tokens, t.attention_mask: mask}
        if t.position_ids is not None:  # else the graph computes them from the mask
            feeds[t.position_ids] = positions
        if cache is None:
            c = self._contract
            empty = np.zeros((tokens.shape[0], c.num_kv_heads, 0, c.head_dim), np.float32)
            for key, value in self._past:
                feeds[key] = feeds[value] = empty
        else:
            for (key, value), k, v in zip(self._past, cache.keys, cache.values, strict=True):
                feeds[key], feeds[value] = k, v
        return self._run(feeds)

    def _cache_of(
        self, outputs: dict[str, np.ndarray]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return [outputs[k] for k, _ in self._present], [outputs[v] for _, v in self._present]
