"""Choosing tokens: greedy, temperature, top-k, top-p, seeds, and the log-probs reported."""

from __future__ import annotations

import numpy as np
import pytest

from kernel.lm.sampling import (
    Position,
    Sampler,
    SamplingParams,
    choose_rows,
    chosen_log_probs,
    greedy_rows,
    log_softmax,
)

LOGITS = np.log(np.asarray([0.05, 0.4, 0.1, 0.3, 0.15], np.float32))


def draws(params: SamplingParams, count: int, logits: np.ndarray = LOGITS) -> list[int]:
    sampler = Sampler(params)
    return [sampler.choose(logits) for _ in range(count)]


def test_greedy_takes_the_argmax():
    assert draws(SamplingParams(0.0, 1.0, 0, None), 3) == [1, 1, 1]


def test_a_seed_gives_the_same_tokens_and_another_seed_others():
    params = SamplingParams(1.0, 1.0, 0, 42)
    first, again = draws(params, 50), draws(params, 50)
    assert first == again
    assert draws(SamplingParams(1.0, 1.0, 0, 43), 50) != first


def test_sampling_follows_the_softmax_of_the_scaled_logits():
    counts = np.bincount(draws(SamplingParams(1.0, 1.0, 0, 0), 20000), minlength=5) / 20000
    assert np.abs(counts - np.exp(LOGITS)).max() < 0.015
    sharp = np.bincount(draws(SamplingParams(0.5, 1.0, 0, 0), 20000), minlength=5) / 20000
    expected = np.exp(2 * LOGITS) / np.exp(2 * LOGITS).sum()
    assert np.abs(sharp - expected).max() < 0.015


def test_top_k_keeps_the_k_most_probable():
    assert set(draws(SamplingParams(1.0, 1.0, 2, 0), 500)) == {1, 3}
    assert draws(SamplingParams(5.0, 1.0, 1, 0), 20) == [1] * 20


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.4, {1}), (0.41, {1, 3}), (0.7, {1, 3}), (0.71, {1, 3, 4}), (1.0, {0, 1, 2, 3, 4})],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept):
    assert set(draws(SamplingParams(1.0, top_p, 0, 0), 3000)) == kept


def test_reported_log_probs_are_the_models_own_in_float64():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 50)).astype(np.float32) * 10
    tokens = np.asarray([3, 0, 49, 17])
    expected = log_softmax(logits)[np.arange(4), tokens]
    got = chosen_log_probs(logits, tokens)
    assert got.dtype == np.float64
    assert np.abs(got - expected).max() < 1e-12


def test_rows_chosen_together_are_the_tokens_each_would_get_alone():
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(7, 40)) * 3).astype(np.float32)
    kinds = [
        SamplingParams(0.0, 1.0, 0, None),
        SamplingParams(1.0, 1.0, 0, 5),
        SamplingParams(0.7, 1.0, 0, 6),
        SamplingParams(1.0, 0.9, 0, 7),
        SamplingParams(1.2, 1.0, 4, 8),
        SamplingParams(0.0, 0.5, 3, None),
        SamplingParams(3.0, 1.0, 0, 9),
    ]
    for _ in range(20):
        alone = [Sampler(k) for k in kinds]
        together = [Sampler(k) for k in kinds]
        expected = [s.choose(logits[row]) for row, s in enumerate(alone)]
        assert choose_rows(logits, together).tolist() == expected
        logits = np.roll(logits, 3, axis=1)


def test_a_vanishing_temperature_is_greedy():
    assert SamplingParams(1e-9, 1.0, 0, 3).greedy
    assert draws(SamplingParams(1e-300, 1.0, 0, 3), 5) == [1] * 5


def test_greedy_rows_are_the_argmax_and_its_log_prob_of_every_row():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, 80)).astype(np.float32) * 8
    tokens, log_probs = greedy_rows(logits)
    greedy = Sampler(SamplingParams(0.0, 1.0, 0, None))
    assert tokens.tolist() == [greedy.choose(row) for row in logits]
    assert tokens.tolist() == choose_rows(logits, [greedy] * 6).tolist()
    assert log_probs.dtype == np.float64
    expected = log_softmax(logits)[np.arange(6), tokens]
    assert np.abs(log_probs - expected).max() < 1e-12


def test_a_shared_position_gives_each_sampler_the_token_and_log_prob_it_would_get_alone():
    rng = np.random.default_rng(2)
    row = (rng.normal(size=64) * 3).astype(np.float32)
    kinds = [
        SamplingParams(0.0, 1.0, 0, None),
        SamplingParams(1.0, 1.0, 0, 5),
        SamplingParams(1.0, 1.0, 0, 6),  # the same temperature: its weights reused
        SamplingParams(0.7, 1.0, 0, 7),
        SamplingParams(1.0, 0.9, 0, 8),
        SamplingParams(1.2, 1.0, 4, 9),
    ]
    position = Position(row)
    for _ in range(10):
        for kind in kinds:
            alone, shared = Sampler(kind), Sampler(kind)
            tokens = [alone.choose(row) for _ in range(3)]
            assert [position.choose(shared) for _ in range(3)] == tokens
            expected = chosen_log_probs(row[None, :], np.asarray(tokens[:1]))[0]
            assert abs(position.log_prob(tokens[0]) - expected) < 1e-12
