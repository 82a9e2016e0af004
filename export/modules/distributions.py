"""torch.distributions as a CleanRL-style policy returns them: kind, parameters, mode, log_prob.

Supported: ``Categorical`` (Discrete), a list or tuple of ``Categorical`` (MultiDiscrete),
``Bernoulli`` or ``Independent(Bernoulli)`` (MultiBinary), and ``Normal`` or
``Independent(Normal)`` (Box).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.distributions import Bernoulli, Categorical, Distribution, Independent, Normal

from export.errors import ExportError
from kernel.distributions import DistributionKind

_SUPPORTED = (
    "Categorical, a list of Categorical, Bernoulli, Normal, or Independent of Bernoulli/Normal"
)


@contextlib.contextmanager
def no_argument_validation() -> Iterator[None]:
    """Distributions built inside skip validate_args checks (data-dependent, untraceable)."""
    previous = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(previous)


def kind_of(distribution: Any) -> DistributionKind:
    if isinstance(distribution, list | tuple):
        if distribution and all(isinstance(d, Categorical) for d in distribution):
            return DistributionKind.MULTI_CATEGORICAL
        raise ExportError(f"the policy returned a list that is not all Categorical; {_SUPPORTED}")
    base = _base(distribution)
    if isinstance(base, Categorical):
        return DistributionKind.CATEGORICAL
    if isinstance(base, Bernoulli):
        return DistributionKind.BERNOULLI
    if isinstance(base, Normal):
        return DistributionKind.DIAG_GAUSSIAN
    raise ExportError(
        f"the policy returned a {type(distribution).__name__} distribution; supported: {_SUPPORTED}"
    )


def parameters(distribution: Any, kind: DistributionKind) -> tuple[Tensor, ...]:
    """(logits,) or (mean, log_std), each [B, width]: what the graph outputs."""
    if kind is DistributionKind.MULTI_CATEGORICAL:
        return (torch.cat([part.logits for part in distribution], dim=-1),)
    base = _base(distribution)
    if kind is DistributionKind.DIAG_GAUSSIAN:
        mean = base.loc.reshape(base.loc.shape[0], -1)
        log_std = torch.log(base.scale).expand_as(base.loc).reshape(mean.shape)
        return mean, log_std
    return (base.logits.reshape(base.logits.shape[0], -1),)


def mode(distribution: Any, kind: DistributionKind) -> Tensor:
    """torch's own most likely action (for a Gaussian: the mean)."""
    if kind is DistributionKind.MULTI_CATEGORICAL:
        return torch.stack([part.mode for part in distribution], dim=-1)
    result: Tensor = distribution.mode
    return result


def sample(distribution: Any, kind: DistributionKind) -> Tensor:
    if kind is DistributionKind.MULTI_CATEGORICAL:
        return torch.stack([part.sample() for part in distribution], dim=-1)
    result: Tensor = distribution.sample()
    return result


def log_prob(distribution: Any, kind: DistributionKind, actions: Tensor) -> Tensor:
    """torch's log-probability of each row's action, summed over action dimensions: [B]."""
    if kind is DistributionKind.MULTI_CATEGORICAL:
        parts = [d.log_prob(actions[:, i]) for i, d in enumerate(distribution)]
        return torch.stack(parts, dim=-1).sum(dim=-1)
    per_row: Tensor = distribution.log_prob(actions)
    return per_row.reshape(len(actions), -1).sum(dim=-1)


def _base(distribution: Any) -> Any:
    return distribution.base_dist if isinstance(distribution, Independent) else distribution
