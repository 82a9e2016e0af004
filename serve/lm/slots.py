"""A batch's key/value cache in preallocated rows that each step grows in place.

For a graph of the ``sequence_lengths`` layout (onnxruntime's ``GroupQueryAttention``):
it reads a row's length from its count of ones in ``attention_mask`` and writes the row's
new key and value at that length. When the ``present`` outputs are bound to the very
arrays given as ``past`` inputs, it writes them there, in place, and reads nothing past a
row's length (onnxruntime-genai's "past-present share buffer"). So a step copies nothing:

- per layer, keys and values are ``[capacity, kv_heads, columns, head_dim]`` arrays; the
  running rows are the first ``rows`` of them, and the graph gets those (a contiguous
  prefix, bound without a copy);
- ``attention_mask`` ``[capacity, columns]`` holds ones on each row's real columns; a step
  sets the one of the row's new token, so the mask is as wide as the cache, and the graph
  attends to each row's own length, not to the width;
- the input ids, the positions (for a graph that takes them) and the logits are bound
  arrays too.

A row that joins has its prefill's cache copied in after the running rows; rows that
leave are replaced by the last rows (only those move), and the batch reorders its own
lists the same way (:meth:`SlotCache.keep` says how). The arrays are reallocated, the
running rows copied over, when a joining row needs more: rows double (from
``FIRST_ROWS``), and the columns become the most that any row will hold (its prompt and
``max_new_tokens``, which the batch says as it adds rows), rounded up to ``COLUMN_STEP``
and never past the context; so a step never reallocates. The graph's arrays are bound
again then; until then a binding is kept for each number of rows the batch has had. The
cache's memory is its arrays', whatever the rows use of them. The batch's token budget
(``max_batch_tokens``) bounds it: rows past the ones running are allocated only while
rows times columns stay within the budget, so the memory is the budget's at most, unless
the rows running alone need more (a request larger than the budget runs alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kernel.lm.contract import LanguageModelContract
from serve.execution.runtime import Binder
from serve.lm.cache import KVCache

__all__ = ["SlotCache"]

FIRST_ROWS = 8  # rows allocated for the first sequences of a batch
COLUMN_STEP = 64  # the columns are a multiple of this (or the context)


class SlotCache:
    """A :class:`~serve.lm.cache.BatchCache` of preallocated rows, grown in place."""

    def __init__(self, contract: LanguageModelContract, bind: Binder, tokens: int) -> None:
        self._contract = contract
        self._bind = bind
        self._tokens = tokens  # the budget: rows times columns allocated, at most
        self._past = [contract.cache_names(i)[:2] for i in range(contract.num_layers)]
        self._present = [contract.cache_names(i)[2:] for i in range(contract.num_layers)]
        # None: the graph counts each row's positions from its mask
        self._position_ids = contract.tensors.position_ids
        self._rows = 0
        self._lengths = np.zeros(0, np.int64)  # per row: its tokens in the cache
        self._keys: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        self._mask = np.zeros((0, 0), np.int64)
        self._ids = np.zeros((0, 1), np.int64)
        self._positions = np.zeros((0, 1), np.int64)
        self._logits = np.zeros((0, 1, contract.vocab_size), np.float32)
        # runs bound to the current arrays, by the number of rows they take
        self._runs: dict[int, Callable[[], None]] = {}
        self._nbytes = 0  # of the keys and values (asked at every step: kept, not summed)

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def capacity(self) -> int:
        return int(self._mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self._mask.shape[1])

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def add(self, caches: Sequence[KVCache], reach: int) -> None:
        rows = self._rows + sum(c.rows for c in caches)
        longest = max(int(c.lengths.max()) for c in caches)
        self._reserve(rows, max(reach, longest + 1))
        row = self._rows
        for cache in caches:
            for r in range(cache.rows):
                length = int(cache.lengths[r])
                for layer in range(len(self._keys)):
                    self._keys[layer][row, :, :length] = cache.keys[layer][r, :, :length]
                    self._values[layer][row, :, :length] = cache.values[layer][r, :, :length]
                self._mask[row] = 0
                self._mask[row, :length] = 1
                self._lengths[row] = length
                row += 1
        self._rows = rows

    def keep(self, rows: Sequence[int]) -> list[int]:
        """The kept rows past the new end move into the slots the dropped ones left."""
        kept = len(rows)
        staying = {row for row in rows if row < kept}
        free = iter([slot for slot in range(kept) if slot not in staying])
        now = list(range(kept))  # slot -> the row it held before; staying rows hold their own
        for row in rows:
            if row >= kept:
                slot = next(free)
                self._move(row, slot)
                now[slot] = row
        self._rows = kept
        return now

    def step(self, tokens: np.ndarray) -> np.ndarray:
        rows = self._rows
        lengths = self._lengths[:rows]
        needed = int(lengths.max()) + 1
        if needed > self.columns:
            self._reserve(rows, needed)
        self._ids[:rows, 0] = tokens
        if self._position_ids is not None:
            self._positions[:rows, 0] = lengths
        self._mask[np.arange(rows), lengths] = 1  # the new token's column
        run = self._runs.get(rows)
        if run is None:
            run = self._runs[rows] = self._bound(rows)
        run()
        self._lengths[:rows] += 1
        return self._logits[:rows, 0]

    # ------------------------------------------------------------------ rows and arrays

    def _move(self, source: int, target: int) -> None:
        length = int(self._lengths[source])
        for arrays in (self._keys, self._values):
            for array in arrays:
                array[target, :, :length] = array[source, :, :length]
        self._mask[target] = self._mask[source]
        self._lengths[target] = length

    def _reserve(self, rows: int, columns: int) -> None:
        """Arrays of at least ``rows`` rows (doubling, within the budget) and ``columns``
        columns (rounded up), the running rows copied over."""
        capacity, width = self.capacity, self.columns
        if rows <= capacity and columns <= width:
            return
        context = self._contract.context_length
        if columns > context:
            raise ValueError(f"{columns} columns asked of a cache of {context} (the context)")
        if rows > capacity:
            capacity = max(rows, 2 * capacity, FIRST_ROWS)
        if columns > width:
            width = min(context, -(-columns // COLUMN_STEP) * COLUMN_STEP)
        capacity = max(rows, min(capacity, self._tokens // width))  # spare rows in budget
        used, c = self._rows, self._contract
        shape = (capacity, c.num_kv_heads, width, c.head_dim)
        self._keys = [_regrown(self._keys, layer, shape, used) for layer in range(c.num_layers)]
        self._values = [_regrown(self._values, layer, shape, used) for layer in range(c.num_layers)]
        mask = np.zeros((capacity, width), np.int64)
        mask[:used, : self.columns] = self._mask[:used]
        lengths = np.zeros(capacity, np.int64)
        lengths[:used] = self._lengths[:used]
        self._mask, self._lengths = mask, lengths
        self._ids = np.zeros((capacity, 1), np.int64)
        self._positions = np.zeros((capacity, 1), np.int64)
        self._logits = np.zeros((capacity, 1, c.vocab_size), np.float32)
        self._runs = {}
        self._nbytes = sum(a.nbytes for a in (*self._keys, *self._values))

    def _bound(self, rows: int) -> Callable[[], None]:
        """The graph's run over the first ``rows`` rows of the current arrays."""
        tensors = self._contract.tensors
        inputs = {tensors.input_ids: self._ids[:rows], tensors.attention_mask: self._mask[:rows]}
        if self._position_ids is not None:
            inputs[self._position_ids] = self._positions[:rows]
        outputs = {tensors.logits: self._logits[:rows]}
        for layer, ((past_key, past_value), (key, value)) in enumerate(
            zip(self._past, self._present, strict=True)
        ):
            inputs[past_key] = outputs[key] = self._keys[layer][:rows]
            inputs[past_value] = outputs[value] = self._values[layer][:rows]
        return self._bind(inputs, outputs)


def _regrown(arrays: list[np.ndarray], layer: int, shape: tuple[int, ...], used: int) -> np.ndarray:
    """A zeroed array of ``shape`` holding the first ``used`` rows of ``arrays[layer]``
    (when there is one)."""
    new = np.zeros(shape, np.float32)
    if layer < len(arrays):
        old = arrays[layer]
        new[:used, :, : old.shape[2]] = old[:used]
    return new
