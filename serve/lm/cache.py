"""The key/value cache of a batch of sequences decoded together.

A batch holds its cache in a :class:`BatchCache`: rows join (each a prefill's own
:class:`KVCache`), rows leave, and a step grows every row by one token. There are two:

- :class:`~serve.lm.slots.SlotCache`: preallocated rows that a step grows in place, for a
  graph that writes each row's new key and value at the row's own length (the
  ``sequence_lengths`` layout) running on the CPU. Nothing is copied per step.
- :class:`CopiedCache` (here): immutable :class:`KVCache` arrays, which the graph returns
  grown by a column (a copy of the whole cache per step); :func:`merge` and
  :meth:`KVCache.select` copy it again when rows join or leave. For the ``left_padded``
  layout, and any graph on a GPU.

The rest of this module is :class:`KVCache`, plain numpy arrays.

Each layer's keys and values are ``[rows, kv_heads, columns, head_dim]``. Where a row's
``lengths[row]`` real tokens sit is the graph's :class:`~kernel.lm.contract.CacheLayout`:

- ``left_padded``: a row's real tokens are its *last* ``lengths[row]`` columns, and the
  columns before them are zeros that the attention mask hides. Every row's next token goes
  in the same new column: ``attention_mask`` ``[rows, columns + 1]`` is 1 on a row's real
  columns and the new one, and ``position_ids`` ``[rows, 1]`` is the row's own length (its
  real tokens), never the column index.
- ``sequence_lengths``: a row's real tokens are its *first* ``lengths[row]`` columns (what
  follows them is never read). The graph reads each row's count of ones in
  ``attention_mask`` ``[rows, columns + 1]`` (its length and the new token) and writes the
  new key and value at the row's own length; positions come from the same count.

A sequence that joins is prefilled alone (its cache has no padding) and :func:`merge`\\ d
at a step boundary: the shorter rows are padded (on the left, or on the right). Rows that
finish are dropped with :meth:`KVCache.select`, which also cuts the columns no remaining
row uses. Both copy the cache; a step itself does not (the graph returns the grown cache).
The mask of the real columns is kept with the cache, so a step's inputs cost one small
copy (the mask with its new column), not a comparison of every column with every row's
length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kernel.lm.contract import CacheLayout

__all__ = ["BatchCache", "CopiedCache", "KVCache", "merge"]


class BatchCache(Protocol):
    """The cache of the rows a batch decodes, and the graph call that grows it."""

    @property
    def rows(self) -> int: ...

    @property
    def nbytes(self) -> int:
        """Bytes of memory it holds."""
        ...

    def add(self, caches: Sequence[KVCache], reach: int) -> None:
        """New rows after the running ones, in order: each a prefill's cache (no padding).
        ``reach``: the most tokens any of them will come to hold (prompt and new tokens)."""
        ...

    def keep(self, rows: Sequence[int]) -> list[int]:
        """Keep these rows (increasing) and drop the others; returns the rows kept, in the
        order they are in now (each row's index before)."""
        ...

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """One new token per row (``tokens`` ``[rows]``) run and kept: the logits
        ``[rows, vocab]``, valid until the next call."""
        ...


@dataclass(frozen=True, slots=True)
class KVCache:
    keys: tuple[np.ndarray, ...]  # per layer [rows, kv_heads, columns, head_dim]
    values: tuple[np.ndarray, ...]
    lengths: np.ndarray  # [rows] int64: real tokens per row (the rest is padding)
    mask: np.ndarray  # [rows, columns] int64: 1 on a row's real columns, 0 on its padding
    layout: CacheLayout = CacheLayout.LEFT_PADDED

    @classmethod
    def of_rows(
        cls,
        keys: Sequence[np.ndarray],
        values: Sequence[np.ndarray],
        layout: CacheLayout = CacheLayout.LEFT_PADDED,
    ) -> KVCache:
        """A cache whose rows have no padding (a prefill's)."""
        rows, columns = keys[0].shape[0], keys[0].shape[2]
        return cls(
            tuple(keys),
            tuple(values),
            np.full(rows, columns, np.int64),
            np.ones((rows, columns), np.int64),
            layout,
        )

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def columns(self) -> int:
        return int(self.keys[0].shape[2])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def step_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """``attention_mask`` ``[rows, columns + 1]`` and ``position_ids`` ``[rows, 1]`` for
        one new token per row (the mask is also the grown cache's)."""
        if self.layout is CacheLayout.LEFT_PADDED:
            new = np.ones((self.rows, 1), np.int64)
            return np.concatenate((self.mask, new), axis=1), self.lengths[:, None]
        mask = np.zeros((self.rows, self.columns + 1), np.int64)
        mask[:, :-1] = self.mask
        mask[np.arange(self.rows), self.lengths] = 1  # the new token: just after the row's own
        return mask, self.lengths[:, None]

    def grown(
        self,
        keys: Sequence[np.ndarray],
        values: Sequence[np.ndarray],
        mask: np.ndarray | None = None,
    ) -> KVCache:
        """The cache after a step: the graph's present tensors, one column longer (``mask``:
        the step's attention mask, when the caller has it; it is the grown cache's)."""
        if mask is None:
            mask = self.step_inputs()[0]
        return KVCache(tuple(keys), tuple(values), self.lengths + 1, mask, self.layout)

    def select(self, rows: Sequence[int]) -> KVCache:
        """These rows only, in this order, without the columns none of them uses."""
        index = np.asarray(rows, np.int64)
        lengths = self.lengths[index]
        longest = int(lengths.max()) if len(index) else 0
        if self.layout is CacheLayout.LEFT_PADDED:
            used = slice(self.columns - longest, self.columns)
        else:
            used = slice(0, longest)
        return KVCache(
            tuple(np.ascontiguousarray(k[index, :, used]) for k in self.keys),
            tuple(np.ascontiguousarray(v[index, :, used]) for v in self.values),
            lengths,
            np.ascontiguousarray(self.mask[index, used]),
            self.layout,
        )


def merge(caches: Sequence[KVCache]) -> KVCache:
    """The rows of every cache, in order, aligned as their layout says (zeros as padding)."""
    if len(caches) == 1:
        return caches[0]
    columns = max(c.columns for c in caches)
    rows = sum(c.rows for c in caches)
    layers = len(caches[0].keys)
    left = caches[0].layout is CacheLayout.LEFT_PADDED
    return KVCache(
        tuple(_aligned([c.keys[i] for c in caches], rows, columns, left) for i in range(layers)),
        tuple(_aligned([c.values[i] for c in caches], rows, columns, left) for i in range(layers)),
        np.concatenate([c.lengths for c in caches]),
        _aligned([c.mask[:, None, :, None] for c in caches], rows, columns, left)[:, 0, :, 0],
        caches[0].layout,
    )


def _aligned(parts: Sequence[np.ndarray], rows: int, columns: int, left: bool) -> np.ndarray:
    """``parts`` ``[rows_i, heads, columns_i, dim]`` stacked on rows, each padded with zeros
    to ``columns``: before its own (``left``) or after them."""
    first = parts[0]
    out = np.zeros((rows, first.shape[1], columns, first.shape[3]), first.dtype)
    row = 0
    for part in parts:
        width = part.shape[2]
        used = slice(columns - width, columns) if left else slice(0, width)
        out[row : row + part.shape[0], :, used] = part
        row += part.shape[0]
    return out


# one step of a graph over a whole cache: logits [rows, vocab] and the cache one column longer
CopiedStep = Callable[[KVCache, np.ndarray], tuple[np.ndarray, KVCache]]


class CopiedCache:
    """A :class:`BatchCache` of :class:`KVCache` arrays, replaced by every step, merge and
    select."""

    def __init__(self, step: CopiedStep) -> None:
        self._step = step
        self._cache: KVCache | None = None

    @property
    def rows(self) -> int:
        return 0 if self._cache is None else self._cache.rows

    @property
    def nbytes(self) -> int:
        return 0 if self._cache is None else self._cache.nbytes

    def add(self, caches: Sequence[KVCache], reach: int) -> None:
        self._cache = merge(caches if self._cache is None else [self._cache, *caches])

    def keep(self, rows: Sequence[int]) -> list[int]:
        self._cache = None if not rows or self._cache is None else self._cache.select(rows)
        return list(rows)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        if self._cache is None:
            raise RuntimeError("a step of an empty batch")
        logits, self._cache = self._step(self._cache, tokens)
        return logits
