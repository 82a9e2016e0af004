"""The batched key/value cache: left padding, masks, positions, merging and dropping rows;
and a batch of uneven sequences decoding exactly as each would alone."""

from __future__ import annotations

import numpy as np
import pytest

from kernel.lm.contract import CacheLayout
from serve.lm.batch import DecodeBatch
from serve.lm.cache import KVCache, merge
from serve.lm.messages import FinishReason
from tests.serve.lm import fakes
from tests.serve.lm.test_sequence import generation

BUDGET = 1 << 14  # max_batch_tokens


def rows_of(*lengths: int, layout: CacheLayout = CacheLayout.LEFT_PADDED) -> KVCache:
    """One cache per length, its keys counting 1..length (so columns can be told apart)."""
    caches = []
    for length in lengths:
        keys = np.arange(1, length + 1, dtype=np.float32).reshape(1, 1, length, 1)
        caches.append(KVCache.of_rows([keys], [-keys], layout))
    return merge(caches)


def test_merge_right_aligns_rows_with_zeros_on_the_left():
    cache = rows_of(3, 1, 2)
    assert cache.rows == 3
    assert cache.columns == 3
    assert cache.keys[0][:, 0, :, 0].tolist() == [[1, 2, 3], [0, 0, 1], [0, 1, 2]]
    assert cache.values[0][:, 0, :, 0].tolist() == [[-1, -2, -3], [0, 0, -1], [0, -1, -2]]
    assert cache.lengths.tolist() == [3, 1, 2]


def test_step_inputs_mask_the_padding_and_count_each_rows_own_positions():
    mask, positions = rows_of(3, 1, 2).step_inputs()
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]]
    assert positions.tolist() == [[3], [1], [2]]
    assert mask.dtype == positions.dtype == np.int64


def test_select_drops_rows_and_the_columns_no_row_uses():
    cache = rows_of(5, 1, 2)
    kept = cache.select([2, 1])
    assert kept.lengths.tolist() == [2, 1]
    assert kept.keys[0][:, 0, :, 0].tolist() == [[1, 2], [0, 1]]
    assert kept.keys[0].flags.c_contiguous


def test_a_grown_cache_counts_the_new_column():
    cache = rows_of(2, 1)
    key = np.concatenate([cache.keys[0], np.ones((2, 1, 1, 1), np.float32)], axis=2)
    grown = cache.grown([key], [key])
    assert grown.lengths.tolist() == [3, 2]
    assert grown.columns == 3
    assert grown.nbytes == 2 * key.nbytes


@pytest.mark.parametrize("layout", list(CacheLayout))
@pytest.mark.parametrize("seed", range(6))
def test_uneven_sequences_joining_and_leaving_decode_as_they_would_alone(seed, layout):
    rng = np.random.default_rng(seed)
    model = fakes.language_model(decoder=fakes.FakeDecoder(layout=layout))
    batch: DecodeBatch[int] = DecodeBatch(model.decoder, tokens=BUDGET)
    arrivals = sorted(int(v) for v in rng.integers(0, 12, size=7))
    prompts = {
        i: [fakes.BOS, *(int(t) for t in rng.integers(3, fakes.VOCAB, size=rng.integers(1, 20)))]
        for i in range(7)
    }
    budgets = {i: int(rng.integers(1, 24)) for i in range(7)}
    sequences = {}
    for step in range(60):
        for i, at in enumerate(arrivals):
            if at == step:
                sequences[i] = model.sequence(
                    generation(model, prompts[i], budgets[i]), streamed=i % 2 == 0
                )
                batch.prefill(i, sequences[i])
        batch.step()
    assert len(batch) == 0
    for i, sequence in sequences.items():
        assert sequence.token_ids == fakes.reference(prompts[i], budgets[i]), i
        assert sequence.finish in (FinishReason.STOP, FinishReason.LENGTH)


def test_dropped_sequences_leave_and_the_others_go_on_unchanged():
    model = fakes.language_model()
    batch: DecodeBatch[str] = DecodeBatch(model.decoder, tokens=BUDGET)
    prompts = {"a": [0, 5, 9, 13, 40], "b": [0, 7], "c": [0, 30, 31, 32]}
    sequences = {
        k: model.sequence(generation(model, p, 20), streamed=True) for k, p in prompts.items()
    }
    for key, sequence in sequences.items():
        batch.prefill(key, sequence)
    batch.step()
    assert batch.drop(lambda key: key == "a") == ["a"]
    while len(batch):
        batch.step()
    assert len(sequences["a"].token_ids) == 2
    for key in "bc":
        assert sequences[key].token_ids == fakes.reference(prompts[key], 20)


def test_a_sequence_that_ends_in_its_prefill_never_joins():
    model = fakes.language_model()
    batch: DecodeBatch[str] = DecodeBatch(model.decoder, tokens=BUDGET)
    sequence = model.sequence(generation(model, [0, 9], 1), streamed=False)
    event, _ = batch.prefill("one", sequence)
    assert sequence.finish is FinishReason.LENGTH
    assert event.index == 0
    assert len(batch) == 0
    assert batch.step() == []


def lengths_mask(cache: KVCache) -> list[list[int]]:
    """The step mask every row's length implies: its lengths[row] columns and the new one,
    last (left-padded) or first (sequence lengths)."""
    total = cache.columns + 1
    if cache.layout is CacheLayout.LEFT_PADDED:
        return [[int(c >= total - (n + 1)) for c in range(total)] for n in cache.lengths.tolist()]
    return [[int(c <= n) for c in range(total)] for n in cache.lengths.tolist()]


def test_rows_of_the_sequence_lengths_layout_come_first_and_pad_on_the_right():
    cache = rows_of(3, 1, 2, layout=CacheLayout.SEQUENCE_LENGTHS)
    assert cache.keys[0][:, 0, :, 0].tolist() == [[1, 2, 3], [1, 0, 0], [1, 2, 0]]
    mask, positions = cache.step_inputs()
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]]
    assert positions.tolist() == [[3], [1], [2]]
    kept = cache.select([2, 1])
    assert kept.keys[0][:, 0, :, 0].tolist() == [[1, 2], [1, 0]]
    assert kept.mask.tolist() == [[1, 1], [1, 0]]


@pytest.mark.parametrize("layout", list(CacheLayout))
def test_the_kept_mask_follows_rows_through_steps_merges_and_drops(layout):
    cache = rows_of(4, 1, layout=layout)
    for new_rows in ([6], [], [2, 3], []):
        key = np.zeros((cache.rows, 1, cache.columns + 1, 1), np.float32)
        mask, positions = cache.step_inputs()
        assert mask.tolist() == lengths_mask(cache)
        assert positions[:, 0].tolist() == cache.lengths.tolist()
        cache = cache.grown([key], [key], mask)
        if new_rows:
            cache = merge([cache, rows_of(*new_rows, layout=layout)])
        else:
            cache = cache.select([r for r in range(cache.rows) if r != 1])
        assert cache.mask.shape == (cache.rows, cache.columns)
        assert cache.step_inputs()[0].tolist() == lengths_mask(cache)
    assert cache.lengths.tolist() == [8, 3, 4]


@pytest.mark.parametrize("layout", list(CacheLayout))
def test_rows_finishing_together_while_others_join_and_one_is_dropped(layout):
    """Uneven prompts; three rows end in one step, two newcomers join at that boundary and
    an owner gives up on another: every row still gets exactly its own tokens."""
    model = fakes.language_model(decoder=fakes.FakeDecoder(layout=layout), context_length=64)
    batch: DecodeBatch[int] = DecodeBatch(model.decoder, tokens=BUDGET)
    prompts = {
        0: [fakes.BOS, 5, 9, 11, 30, 7, 7, 40],
        1: [fakes.BOS, 12],
        2: [fakes.BOS, 3, 3, 50, 22],
        3: [fakes.BOS, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 61],
        4: [fakes.BOS, 44, 2],
        5: [fakes.BOS, 17, 18, 19],
        6: [fakes.BOS, 60],
    }
    budgets = {0: 6, 1: 6, 2: 6, 3: 14, 4: 14, 5: 9, 6: 12}  # 0, 1, 2 end in one step
    sequences = {i: model.sequence(generation(model, prompts[i], budgets[i], ignore_eos=True),
                                   streamed=i % 2 == 1) for i in prompts}  # fmt: skip
    for i in (0, 1, 2, 3, 4):
        batch.prefill(i, sequences[i])
    finished_together = []
    gone: set[int] = set()
    for step in range(20):
        if step == 4:
            gone.add(4)  # its owner went away
            assert batch.drop(lambda owner: owner in gone) == [4]
        emitted = batch.step()
        ended = [owner for owner, sequence, _ in emitted if sequence.finish is not None]
        if len(ended) > 1:
            finished_together.append(sorted(ended))
        if sorted(ended) == [0, 1, 2]:
            for i in (5, 6):  # join at the boundary where three rows left
                batch.prefill(i, sequences[i])
    assert [0, 1, 2] in finished_together
    assert len(batch) == 0
    for i, sequence in sequences.items():
        expected = fakes.reference(prompts[i], budgets[i], stop_at_eos=False)
        if i == 4:
            assert sequence.token_ids == expected[: len(sequence.token_ids)]
            assert sequence.finish is None
        else:
            assert sequence.token_ids == expected, i
