"""The exported graphs decoded by the server's batch caches (serve.lm.cache, serve.lm.slots):
rows that join, leave and outgrow their arrays give the logits they give in a cache copied
at every step, row for row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from export.lm import pipeline
from serve import config
from serve.execution.runtime import CPU, Execution, create_session
from serve.lm import slots
from serve.lm.cache import BatchCache, KVCache
from serve.lm.decoder import CacheStorage, GraphDecoder
from serve.lm.model import LanguageModel


def _model(outcome: pipeline.LmExportOutcome) -> LanguageModel:
    assert outcome.path is not None
    path = Path(outcome.path)
    session = create_session(
        path / "model.onnx", config.load(providers=[CPU]), "m/1", execution=Execution.RUN
    )
    return LanguageModel.load("m", 1, path, session, "0" * 64)


class _Rows:
    """A batch cache and which sequence each of its rows holds."""

    def __init__(self, cache: BatchCache) -> None:
        self.cache = cache
        self.held: list[int] = []  # sequence ids, by row
        self.tokens: dict[int, int] = {}  # each sequence's next input

    def add(self, joining: list[tuple[int, KVCache, int]], reach: int) -> None:
        self.cache.add([cache for _, cache, _ in joining], reach)
        self.held += [sequence for sequence, _, _ in joining]
        self.tokens.update({sequence: token for sequence, _, token in joining})

    def drop(self, sequences: set[int]) -> None:
        rows = [row for row, s in enumerate(self.held) if s not in sequences]
        order = self.cache.keep(rows)
        assert sorted(order) == rows
        self.held = [self.held[row] for row in order]

    def step(self) -> dict[int, np.ndarray]:
        tokens = np.asarray([self.tokens[s] for s in self.held], np.int64)
        logits = self.cache.step(tokens).copy()
        for s, row in zip(self.held, logits, strict=True):
            self.tokens[s] = int(row.argmax())
        return dict(zip(self.held, logits, strict=True))


def test_slots_decode_as_copies_through_joins_drops_and_growth(
    llama_export: pipeline.LmExportOutcome,
) -> None:
    model = _model(llama_export)
    decoder = model.decoder
    assert isinstance(decoder, GraphDecoder)
    assert decoder.storage is CacheStorage.SLOTS  # the default graph on the CPU
    slotted, copied = _Rows(decoder.batch_cache(1 << 14)), _Rows(decoder.copied_cache())
    rng = np.random.default_rng(7)
    vocab = model.contract.vocab_size
    prompts = [rng.integers(3, vocab, size=n).tolist() for n in (5, 40, 17, 3, 60, 9, 33, 12)]
    prefilled = {}
    for index, prompt in enumerate(prompts):
        logits, cache = decoder.prefill(prompt)
        prefilled[index] = (index, cache, int(logits[-1].argmax()))
    shared = prefilled[1]  # a group's choices share their prompt's prefill
    plan: list[tuple[str, list[int]]] = [
        ("add", [0, 1, 2]),
        ("steps", [6]),
        ("add", [3, 10, 11]),  # 10, 11: the second prompt again
        ("steps", [3]),
        ("drop", [0, 2]),  # rows past the new end move into their slots
        ("steps", [2]),
        ("add", [4, 5, 6, 7, 12, 13]),  # beyond the first rows allocated
        ("drop", [10, 5]),
        ("steps", [80]),  # past the reach said: the columns grow during a step
    ]
    for what, args in plan:
        if what == "add":
            joining = [
                prefilled[i] if i < len(prompts) else (i, shared[1], shared[2]) for i in args
            ]
            reach = max(cache.columns for _, cache, _ in joining) + 20
            slotted.add(joining, reach)
            copied.add(joining, reach)
        elif what == "drop":
            slotted.drop(set(args))
            copied.drop(set(args))
        else:
            for _ in range(args[0]):
                a, b = slotted.step(), copied.step()
                assert a.keys() == b.keys()
                for sequence in a:
                    np.testing.assert_allclose(a[sequence], b[sequence], atol=1e-5, rtol=0)
                    assert a[sequence].argmax() == b[sequence].argmax()
    slot_cache = slotted.cache
    assert isinstance(slot_cache, slots.SlotCache)
    assert slot_cache.capacity > slots.FIRST_ROWS
    assert slot_cache.columns >= 60 + 80
    c = model.contract
    row_bytes = 2 * c.num_layers * c.num_kv_heads * slot_cache.columns * c.head_dim * 4
    assert slot_cache.nbytes == slot_cache.capacity * row_bytes  # what the metrics show


def test_slots_allocate_spare_rows_only_within_the_batch_budget(
    llama_export: pipeline.LmExportOutcome,
) -> None:
    model = _model(llama_export)
    _, cache = model.decoder.prefill([5, 6, 7])
    slot_cache = model.decoder.batch_cache(300)  # a budget of 300 tokens: one row of 200
    assert isinstance(slot_cache, slots.SlotCache)
    slot_cache.add([cache], 200)
    assert (slot_cache.capacity, slot_cache.columns) == (1, 256)  # not FIRST_ROWS
    slot_cache.add([cache, cache], 200)  # rows running get their slots, budget or not
    assert slot_cache.capacity == 3
    slot_cache.keep([2])
    assert slot_cache.rows == 1
    assert slot_cache.capacity == 3  # kept until the batch ends
    wide = model.decoder.batch_cache(1 << 14)
    assert isinstance(wide, slots.SlotCache)
    wide.add([cache], 40)
    assert (wide.capacity, wide.columns) == (slots.FIRST_ROWS, 64)


@pytest.mark.parametrize("size", [1, 4])
def test_a_copied_cache_is_what_a_left_padded_graph_decodes_in(
    qwen2_grpo_export: tuple[object, pipeline.LmExportOutcome], size: int
) -> None:
    model = _model(qwen2_grpo_export[1])
    decoder = model.decoder
    assert isinstance(decoder, GraphDecoder)
    assert decoder.storage is CacheStorage.COPIES  # the torch.onnx graph pads on the left
    _, cache = decoder.prefill([5, 6, 7])
    rows = decoder.batch_cache(1 << 14)
    rows.add([cache] * size, 4)
    assert rows.step(np.full(size, 8, np.int64)).shape == (size, model.contract.vocab_size)
