"""The numpy reference distributions agree with torch.distributions to 1e-5."""

from typing import Any

import numpy as np
import pytest
import torch
from torch.distributions import Bernoulli, Categorical, Normal, kl_divergence

from kernel import distributions as dist
from kernel.distributions import DistributionKind, build

RNG = np.random.default_rng(0)


def test_categorical_log_probs_match_torch() -> None:
    logits = RNG.standard_normal((64, 5)).astype(np.float32) * 3
    actions = RNG.integers(0, 5, 64)
    ours = build(DistributionKind.CATEGORICAL, {"logits": logits}).log_prob(actions)
    theirs = Categorical(logits=torch.from_numpy(logits)).log_prob(torch.from_numpy(actions))
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-5)


def test_multi_categorical_log_probs_are_sums_of_their_parts() -> None:
    nvec = (3, 2, 4)
    logits = RNG.standard_normal((32, sum(nvec))).astype(np.float32)
    actions = np.stack([RNG.integers(0, n, 32) for n in nvec], axis=1)
    ours = build(DistributionKind.MULTI_CATEGORICAL, {"logits": logits}, nvec).log_prob(actions)
    parts = torch.split(torch.from_numpy(logits), list(nvec), dim=1)
    theirs = sum(
        Categorical(logits=p).log_prob(torch.from_numpy(actions[:, i])) for i, p in enumerate(parts)
    )
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-5)


def test_bernoulli_log_probs_match_torch() -> None:
    logits = RNG.standard_normal((32, 6)).astype(np.float32) * 4
    actions = RNG.integers(0, 2, (32, 6))
    ours = build(DistributionKind.BERNOULLI, {"logits": logits}).log_prob(actions)
    theirs = (
        Bernoulli(logits=torch.from_numpy(logits))
        .log_prob(torch.from_numpy(actions).float())
        .sum(1)
    )
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-5)


def test_gaussian_log_probs_match_torch() -> None:
    mean = RNG.standard_normal((32, 3)).astype(np.float32)
    log_std = RNG.uniform(-2, 1, (32, 3)).astype(np.float32)
    actions = (mean + np.exp(log_std) * RNG.standard_normal((32, 3))).astype(np.float32)
    ours = build(DistributionKind.DIAG_GAUSSIAN, {"mean": mean, "log_std": log_std}).log_prob(
        actions
    )
    theirs = (
        Normal(torch.from_numpy(mean), torch.from_numpy(log_std).exp())
        .log_prob(torch.from_numpy(actions))
        .sum(1)
    )
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-5)


@pytest.mark.parametrize("kind", [kind for kind in DistributionKind if kind.stochastic])
def test_a_seed_reproduces_the_same_samples(kind: DistributionKind) -> None:
    params = {
        "logits": RNG.standard_normal((8, 4)),
        "mean": np.zeros((8, 4)),
        "log_std": np.zeros((8, 4)),
    }
    dist = build(kind, params, (2, 2))
    first = dist.sample(np.random.default_rng(42))
    again = dist.sample(np.random.default_rng(42))
    np.testing.assert_array_equal(first, again)


def test_categorical_samples_follow_the_probabilities() -> None:
    logits = np.log(np.array([[0.7, 0.2, 0.1]] * 20000))
    drawn = build(DistributionKind.CATEGORICAL, {"logits": logits}).sample(np.random.default_rng(1))
    np.testing.assert_allclose(np.bincount(drawn, minlength=3) / 20000, [0.7, 0.2, 0.1], atol=0.01)


def test_the_bernoulli_mode_is_one_exactly_for_positive_logits() -> None:
    logits = np.array([[-1.0, 0.0, 1e-6, 2.0]])
    assert build(DistributionKind.BERNOULLI, {"logits": logits}).mode().tolist() == [[0, 0, 1, 1]]


def test_squashed_gaussian_log_probs_match_stable_baselines3() -> None:
    from stable_baselines3.common.distributions import SquashedDiagGaussianDistribution

    mean = RNG.standard_normal((64, 2)).astype(np.float32)
    log_std = RNG.uniform(-2, 0.5, (64, 2)).astype(np.float32)
    gaussian = mean + np.exp(log_std) * RNG.standard_normal((64, 2))
    actions = np.tanh(gaussian)  # in [-1, 1], away from the float32 edge
    params = {"mean": mean, "log_std": log_std}
    dist = build(DistributionKind.SQUASHED_DIAG_GAUSSIAN, params)
    sb3 = SquashedDiagGaussianDistribution(2).proba_distribution(
        torch.from_numpy(mean).double(), torch.from_numpy(log_std).double()
    )
    theirs = sb3.log_prob(torch.from_numpy(actions), gaussian_actions=torch.from_numpy(gaussian))
    np.testing.assert_allclose(dist.log_prob(actions), theirs.numpy(), rtol=1e-5, atol=1e-5)


def test_squashed_gaussian_samples_stay_inside_and_their_mode_is_tanh_of_the_mean() -> None:
    params = {"mean": np.array([[0.0, 3.0, -30.0]]), "log_std": np.array([[2.0, 2.0, 2.0]])}
    dist = build(DistributionKind.SQUASHED_DIAG_GAUSSIAN, params)
    drawn = np.concatenate([dist.sample(np.random.default_rng(i)) for i in range(200)])
    assert np.all(np.abs(drawn) <= 1.0)
    np.testing.assert_allclose(dist.mode(), np.tanh(params["mean"]), rtol=1e-6)
    # An action at the bound (a client may send one to be scored) has a finite log-prob.
    assert np.isfinite(dist.log_prob(np.array([[1.0, -1.0, 1.0]]))).all()


def test_a_deterministic_policy_has_no_distribution_to_build() -> None:
    assert not DistributionKind.DETERMINISTIC.stochastic
    with pytest.raises(ValueError, match="no distribution"):
        build(DistributionKind.DETERMINISTIC, {})


# -- KL divergences: the shadow canary's measure of two versions' distributions ---------------


def _t(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(values)


def test_kl_matches_torchs_for_every_stochastic_kind() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(64, 5)), rng.normal(size=(64, 5))
    s1, s2 = rng.normal(scale=0.3, size=(64, 5)), rng.normal(scale=0.3, size=(64, 5))
    categorical = kl_divergence(Categorical(logits=_t(a)), Categorical(logits=_t(b)))
    bernoulli = kl_divergence(Bernoulli(logits=_t(a)), Bernoulli(logits=_t(b))).sum(-1)
    normal = kl_divergence(Normal(_t(a), _t(np.exp(s1))), Normal(_t(b), _t(np.exp(s2)))).sum(-1)
    pairs = zip(np.split(a, [2], axis=1), np.split(b, [2], axis=1), strict=True)
    first, second = (
        kl_divergence(Categorical(logits=_t(x)), Categorical(logits=_t(y))) for x, y in pairs
    )
    multi = first + second
    cases: list[tuple[Any, Any, torch.Tensor]] = [
        (dist.Categorical(a), dist.Categorical(b), categorical),
        (dist.Bernoulli(a), dist.Bernoulli(b), bernoulli),
        (dist.DiagGaussian(a, s1), dist.DiagGaussian(b, s2), normal),
        (dist.SquashedDiagGaussian(a, s1), dist.SquashedDiagGaussian(b, s2), normal),
        (dist.MultiCategorical(a, (2, 3)), dist.MultiCategorical(b, (2, 3)), multi),
    ]
    for mine, theirs, expected in cases:
        np.testing.assert_allclose(mine.kl(theirs), expected.numpy(), rtol=1e-9, atol=1e-12)


def test_a_distribution_does_not_diverge_from_itself() -> None:
    logits = np.random.default_rng(4).normal(size=(8, 3))
    assert np.allclose(dist.Categorical(logits).kl(dist.Categorical(logits)), 0.0)
    assert np.all(dist.Categorical(logits).kl(dist.Categorical(logits[::-1])) > 0.0)
