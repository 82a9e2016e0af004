"""Action distributions in numpy: the reference for stochastic actions and log-probabilities.

An exported graph outputs the distribution's parameters (logits, or mean and log_std) and
the deterministic action; a deterministic policy (TD3, DDPG, DQN) has no distribution.
Sampling and log-probabilities happen here, on those parameters, so that a seed reproduces
the same actions anywhere and ``log_prob`` of a given action matches the source policy's
``evaluate_actions`` (tests hold it to 1e-5).

Every method works on all rows at once. Sampling is split in two so that a batch can mix
randomness sources: ``draw(rng, rows)`` takes the random numbers that ``sample_with`` turns
into actions, and ``sample(rng)`` is the two together. A request's own seed therefore
gives the same actions whatever other rows share its batch.

Computation is in float64 and results are returned as float32, the policies' precision
(a squashed Gaussian's samples excepted: see ``SquashedDiagGaussian.sample_with``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


class DistributionKind(StrEnum):
    CATEGORICAL = "categorical"  # Discrete actions: logits [B, n]
    MULTI_CATEGORICAL = "multi_categorical"  # MultiDiscrete: logits [B, sum(nvec)]
    BERNOULLI = "bernoulli"  # MultiBinary: logits [B, n]
    DIAG_GAUSSIAN = "diag_gaussian"  # Box: mean [B, d], log_std [B, d]
    # Box, SAC: a Gaussian over mean [B, d], log_std [B, d] squashed by tanh into [-1, 1],
    # which the policy heads rescale to the Box's bounds
    SQUASHED_DIAG_GAUSSIAN = "squashed_diag_gaussian"
    DETERMINISTIC = "deterministic"  # TD3, DDPG, DQN: the action alone, nothing to sample

    @property
    def stochastic(self) -> bool:
        """Whether the policy has a distribution to sample from and score actions under."""
        return self is not DistributionKind.DETERMINISTIC


class Distribution(Protocol):
    def mode(self) -> np.ndarray: ...
    def draw(self, rng: np.random.Generator, rows: int) -> np.ndarray: ...
    def sample_with(self, noise: np.ndarray) -> np.ndarray: ...
    def sample(self, rng: np.random.Generator) -> np.ndarray: ...
    def log_prob(self, actions: np.ndarray) -> np.ndarray: ...
    def take(self, rows: np.ndarray) -> Distribution: ...
    def kl(self, other: Any) -> np.ndarray:
        """KL(self || other) per row, in float64: ``other`` is the same kind of distribution
        over the same actions (another version of the policy, on the same observations)."""
        ...


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _sample_index(log_p: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling, one uniform number per row ([rows, 1])."""
    cdf = np.cumsum(np.exp(log_p), axis=-1)
    u = uniform * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=-1), log_p.shape[-1] - 1).astype(np.int64)


@dataclass(frozen=True)
class Categorical:
    logits: np.ndarray  # [B, n]

    @functools.cached_property
    def _log_p(self) -> np.ndarray:
        """The log-probabilities, once for sampling and scoring alike."""
        return _log_softmax(self.logits)

    def mode(self) -> np.ndarray:
        return self.logits.argmax(axis=-1).astype(np.int64)

    def draw(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        return rng.random((rows, 1))

    def sample_with(self, noise: np.ndarray) -> np.ndarray:
        return _sample_index(self._log_p, noise)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return self.sample_with(self.draw(rng, len(self.logits)))

    def take(self, rows: np.ndarray) -> Categorical:
        return Categorical(self.logits[rows])

    def log_prob(self, actions: np.ndarray) -> np.ndarray:
        taken = actions.astype(np.int64).reshape(-1)
        picked = self._log_p[np.arange(len(taken)), taken]  # each row's own action
        return picked.astype(np.float32)

    def kl(self, other: Categorical) -> np.ndarray:
        log_p, log_q = self._log_p, other._log_p
        result: np.ndarray = (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)
        return result


@dataclass(frozen=True)
class MultiCategorical:
    logits: np.ndarray  # [B, sum(nvec)], the categoricals side by side
    nvec: tuple[int, ...]

    def _parts(self) -> list[Categorical]:
        edges = np.cumsum(self.nvec)[:-1]
        return [Categorical(part) for part in np.split(self.logits, edges, axis=-1)]

    def mode(self) -> np.ndarray:
        return np.stack([c.mode() for c in self._parts()], axis=-1)

    def draw(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        # One column per categorical, drawn part after part (as sampling them in turn would).
        return rng.random((len(self.nvec), rows)).T

    def sample_with(self, noise: np.ndarray) -> np.ndarray:
        parts = self._parts()
        return np.stack([c.sample_with(noise[:, i : i + 1]) for i, c in enumerate(parts)], -1)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return self.sample_with(self.draw(rng, len(self.logits)))

    def take(self, rows: np.ndarray) -> MultiCategorical:
        return MultiCategorical(self.logits[rows], self.nvec)

    def log_prob(self, actions: np.ndarray) -> np.ndarray:
        parts = self._parts()
        total = sum(c.log_prob(actions[:, i]).astype(np.float64) for i, c in enumerate(parts))
        return np.asarray(total, dtype=np.float32)

    def kl(self, other: MultiCategorical) -> np.ndarray:
        """The categoricals are independent: their divergences add up."""
        pairs = zip(self._parts(), other._parts(), strict=True)
        return np.asarray(sum(mine.kl(theirs) for mine, theirs in pairs), dtype=np.float64)


@dataclass(frozen=True)
class Bernoulli:
    logits: np.ndarray  # [B, n]

    def mode(self) -> np.ndarray:
        # round(sigmoid(l)) with round-half-to-even: 1 exactly when l > 0.
        return (self.logits > 0).astype(np.int64)

    def draw(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        return rng.random((rows, self.logits.shape[-1]))

    def sample_with(self, noise: np.ndarray) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-self.logits.astype(np.float64)))
        return (noise < p).astype(np.int64)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return self.sample_with(self.draw(rng, len(self.logits)))

    def take(self, rows: np.ndarray) -> Bernoulli:
        return Bernoulli(self.logits[rows])

    def log_prob(self, actions: np.ndarray) -> np.ndarray:
        z = self.logits.astype(np.float64)
        a = actions.astype(np.float64)
        # log sigmoid(z) = -softplus(-z); log(1 - sigmoid(z)) = -softplus(z)
        per_dim = -a * np.logaddexp(0.0, -z) - (1.0 - a) * np.logaddexp(0.0, z)
        return per_dim.sum(axis=-1).astype(np.float32)

    def kl(self, other: Bernoulli) -> np.ndarray:
        z, w = self.logits.astype(np.float64), other.logits.astype(np.float64)
        p = 1.0 / (1.0 + np.exp(-z))
        # log p - log q = softplus(-w) - softplus(-z); log(1-p) - log(1-q) likewise
        per_dim = p * (np.logaddexp(0.0, -w) - np.logaddexp(0.0, -z)) + (1.0 - p) * (
            np.logaddexp(0.0, w) - np.logaddexp(0.0, z)
        )
        result: np.ndarray = per_dim.sum(axis=-1)
        return result


@dataclass(frozen=True)
class DiagGaussian:
    mean: np.ndarray  # [B, d]
    log_std: np.ndarray  # [B, d]

    def mode(self) -> np.ndarray:
        return self.mean.astype(np.float32)

    def draw(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        return rng.standard_normal((rows, self.mean.shape[-1]))

    def sample_with(self, noise: np.ndarray) -> np.ndarray:
        return (self.mean + np.exp(self.log_std.astype(np.float64)) * noise).astype(np.float32)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return self.sample_with(self.draw(rng, len(self.mean)))

    def take(self, rows: np.ndarray) -> DiagGaussian:
        return DiagGaussian(self.mean[rows], self.log_std[rows])

    def log_prob(self, actions: np.ndarray) -> np.ndarray:
        return _gaussian_log_prob(self.mean, self.log_std, actions).astype(np.float32)

    def kl(self, other: DiagGaussian | SquashedDiagGaussian) -> np.ndarray:
        return _gaussian_kl(self.mean, self.log_std, other.mean, other.log_std)


def _gaussian_kl(
    mean: np.ndarray, log_std: np.ndarray, other_mean: np.ndarray, other_log_std: np.ndarray
) -> np.ndarray:
    """KL between diagonal Gaussians, summed over dimensions, in float64."""
    s1, s2 = log_std.astype(np.float64), other_log_std.astype(np.float64)
    gap = mean.astype(np.float64) - other_mean.astype(np.float64)
    per_dim = s2 - s1 + (np.exp(2 * s1) + gap * gap) / (2 * np.exp(2 * s2)) - 0.5
    result: np.ndarray = per_dim.sum(axis=-1)
    return result


def _gaussian_log_prob(mean: np.ndarray, log_std: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The diagonal Gaussian's log-density of each row of ``x``, in float64."""
    log_std64 = log_std.astype(np.float64)
    z = (x.astype(np.float64) - mean.astype(np.float64)) / np.exp(log_std64)
    per_dim = -0.5 * z * z - log_std64 - _LOG_SQRT_2PI
    result: np.ndarray = per_dim.sum(axis=-1)
    return result


# SB3's TanhBijector: atanh's argument kept this far inside (-1, 1), and the epsilon of the
# log-determinant of tanh, log(1 - a^2 + eps).
_TANH_INSIDE = float(np.finfo(np.float32).eps)
_TANH_LOG_DET_EPS = 1e-6


@dataclass(frozen=True)
class SquashedDiagGaussian:
    """SAC's policy: u ~ N(mean, exp(log_std)), action tanh(u) in [-1, 1]. ``log_prob``
    takes actions in [-1, 1] and includes the tanh correction, as Stable-Baselines3's
    ``SquashedDiagGaussianDistribution`` computes it (the rescaling to the Box's bounds adds
    a constant that it leaves out, and so does this)."""

    mean: np.ndarray  # [B, d]
    log_std: np.ndarray  # [B, d]

    def mode(self) -> np.ndarray:
        return np.tanh(self.mean.astype(np.float64)).astype(np.float32)

    def draw(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        return rng.standard_normal((rows, self.mean.shape[-1]))

    def sample_with(self, noise: np.ndarray) -> np.ndarray:
        """In float64: tanh rounds to +-1 in float32 long before it does in float64, and a
        sampled action's log-probability is computed from this value."""
        gaussian = self.mean + np.exp(self.log_std.astype(np.float64)) * noise
        squashed: np.ndarray = np.tanh(gaussian)
        return squashed

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return self.sample_with(self.draw(rng, len(self.mean)))

    def take(self, rows: np.ndarray) -> SquashedDiagGaussian:
        return SquashedDiagGaussian(self.mean[rows], self.log_std[rows])

    def log_prob(self, actions: np.ndarray) -> np.ndarray:
        squashed = actions.astype(np.float64)
        inside = np.clip(squashed, -1.0 + _TANH_INSIDE, 1.0 - _TANH_INSIDE)
        gaussian = _gaussian_log_prob(self.mean, self.log_std, np.arctanh(inside))
        correction = np.log(1.0 - squashed * squashed + _TANH_LOG_DET_EPS).sum(axis=-1)
        return (gaussian - correction).astype(np.float32)

    def kl(self, other: SquashedDiagGaussian) -> np.ndarray:
        """tanh is one-to-one: the squashed distributions diverge as their Gaussians do."""
        return _gaussian_kl(self.mean, self.log_std, other.mean, other.log_std)


def build(
    kind: DistributionKind, params: dict[str, np.ndarray], nvec: tuple[int, ...] | None = None
) -> Distribution:
    """The distribution of a batch from the graph outputs named by role (logits, mean, log_std)."""
    if kind is DistributionKind.CATEGORICAL:
        return Categorical(params["logits"])
    if kind is DistributionKind.MULTI_CATEGORICAL:
        if nvec is None:
            raise ValueError("a multi_categorical distribution needs nvec")
        return MultiCategorical(params["logits"], nvec)
    if kind is DistributionKind.BERNOULLI:
        return Bernoulli(params["logits"])
    if kind is DistributionKind.SQUASHED_DIAG_GAUSSIAN:
        return SquashedDiagGaussian(params["mean"], params["log_std"])
    if kind is DistributionKind.DETERMINISTIC:
        raise ValueError("a deterministic policy has no distribution to build")
    return DiagGaussian(params["mean"], params["log_std"])
