"""Action distributions in numpy: the reference for stochastic actions and log-probabilities.

An exported graph outputs the distribution's parameters (logits, or mean and log_std) and
the deterministic action. Sampling and log-probabilities happen here, on those parameters,
so that a seed reproduces the same actions anywhere and ``log_prob`` of a given action
matches the source policy's ``evaluate_actions`` (tests hold it to 1e-5).

Every method works on all rows at once. Sampling is split in two so that a batch can mix
randomness sources: ``draw(rng, rows)`` takes the random numbers that ``sample_with`` turns
into actions, and ``sample(rng)`` is the two together. A request's own seed therefore
gives the same actions whatever other rows share its batch.

Computation is in float64 and results are returned as float32, the policies' precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


class DistributionKind(StrEnum):
    CATEGORICAL = "categorical"  # Discrete actions: logits [B, n]
    MULTI_CATEGORICAL = "multi_categorical"  # MultiDiscrete: logits [B, sum(nvec)]
    BERNOULLI = "bernoulli"  # MultiBinary: logits [B, n]
    DIAG_GAUSSIAN = "diag_gaussian"  # Box: mean [B, d], log_std [B, d]


class Distribution(Protocol):
    def mode(self) -> np.ndarray: ...
    def draw(self, rng: np.random.Generator, rows: int) -> np.ndarray: ...
    def sample_with(self, noise: np.ndarray) -> np.ndarray: ...
    def sample(self, rng: np.random.Generator) -> np.ndarray: ...
    def log_prob(self, actions: np.ndarray) -> np.ndarray: ...
    def take(self, rows: np.ndarray) -> Distribution: ...


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

    def mode(self) -> np.ndarray:
        return self.logits.argmax(axis=-1).astype(np.int64)

    def draw(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        return rng.random((rows, 1))

    def sample_with(self, noise: np.ndarray) -> np.ndarray:
        return _sample_index(_log_softmax(self.logits), noise)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return self.sample_with(self.draw(rng, len(self.logits)))

    def take(self, rows: np.ndarray) -> Categorical:
        return Categorical(self.logits[rows])

    def log_prob(self, actions: np.ndarray) -> np.ndarray:
        log_p = _log_softmax(self.logits)
        picked = np.take_along_axis(log_p, actions.astype(np.int64).reshape(-1, 1), axis=-1)
        return picked[:, 0].astype(np.float32)


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
        mean, log_std = self.mean.astype(np.float64), self.log_std.astype(np.float64)
        z = (actions.astype(np.float64) - mean) / np.exp(log_std)
        per_dim = -0.5 * z * z - log_std - _LOG_SQRT_2PI
        return per_dim.sum(axis=-1).astype(np.float32)


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
    return DiagGaussian(params["mean"], params["log_std"])
