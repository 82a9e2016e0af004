"""The key/value cache of a batch of sequences decoded together, as plain numpy arrays.

Each layer's keys and values are ``[rows, kv_heads, columns, head_dim]``. Rows are
*left-padded*: a row's real tokens are its last ``lengths[row]`` columns, and the columns
before them are zeros that the attention mask hides. So every row's next token goes in the
same new column, and one graph call decodes rows of any lengths:

- ``attention_mask`` ``[rows, columns + 1]`` is 1 on a row's real columns and the new one;
- ``position_ids`` ``[rows, 1]`` is the row's own length (its real tokens), never the
  column index.

A sequence that joins is prefilled alone (its cache has no padding) and :func:`merge`\\ d
at a step boundary: the shorter side is padded on the left. Rows that finish are dropped
with :meth:`KVCache.select`, which also cuts the leading columns no remaining row uses.
Both copy the cache; a step itself does not (the graph returns the grown cache). The mask
of the real columns is kept with the cache, so a step's inputs cost one small copy
(the mask with its new column), not a comparison of every column with every row's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["KVCache", "merge"]


@dataclass(frozen=True, slots=True)
class KVCache:
    keys: tuple[np.ndarray, ...]  # per layer [rows, kv_heads, columns, head_dim]
    values: tuple[np.ndarray, ...]
    lengths: np.ndarray  # [rows] int64: real tokens per row (the rest is left padding)
    mask: np.ndarray  # [rows, columns] int64: 1 on a row's real columns, 0 on its padding

    @classmethod
    def of_rows(cls, keys: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> KVCache:
        """A cache whose rows have no padding (a prefill's)."""
        rows, columns = keys[0].shape[0], keys[0].shape[2]
        return cls(
            tuple(keys),
            tuple(values),
            np.full(rows, columns, np.int64),
            np.ones((rows, columns), np.int64),
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
        one new token per row."""
        new = np.ones((self.rows, 1), np.int64)
        return np.concatenate((self.mask, new), axis=1), self.lengths[:, None]

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
        return KVCache(tuple(keys), tuple(values), self.lengths + 1, mask)

    def select(self, rows: Sequence[int]) -> KVCache:
        """These rows only, in this order, without the columns none of them uses."""
        index = np.asarray(rows, np.int64)
        lengths = self.lengths[index]
        start = self.columns - int(lengths.max()) if len(index) else self.columns
        return KVCache(
            tuple(np.ascontiguousarray(k[index, :, start:]) for k in self.keys),
            tuple(np.ascontiguousarray(v[index, :, start:]) for v in self.values),
            lengths,
            np.ascontiguousarray(self.mask[index, start:]),
        )


def merge(caches: Sequence[KVCache]) -> KVCache:
    """The rows of every cache, in order, right-aligned to the longest (zeros on the left)."""
    if len(caches) == 1:
        return caches[0]
    columns = max(c.columns for c in caches)
    rows = sum(c.rows for c in caches)
    layers = len(caches[0].keys)
    return KVCache(
        tuple(_aligned([c.keys[i] for c in caches], rows, columns) for i in range(layers)),
        tuple(_aligned([c.values[i] for c in caches], rows, columns) for i in range(layers)),
        np.concatenate([c.lengths for c in caches]),
        _aligned_mask([c.mask for c in caches], rows, columns),
    )


def _aligned(parts: Sequence[np.ndarray], rows: int, columns: int) -> np.ndarray:
    first = parts[0]
    out = np.zeros((rows, first.shape[1], columns, first.shape[3]), first.dtype)
    row = 0
    for part in parts:
        out[row : row + part.shape[0], :, columns - part.shape[2] :] = part
        row += part.shape[0]
    return out


def _aligned_mask(parts: Sequence[np.ndarray], rows: int, columns: int) -> np.ndarray:
    out = np.zeros((rows, columns), np.int64)
    row = 0
    for part in parts:
        out[row : row + part.shape[0], columns - part.shape[1] :] = part
        row += part.shape[0]
    return out
