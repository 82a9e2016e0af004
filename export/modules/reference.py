"""A torch module's own answers for raw observations: what parity holds the graph to.

The method is called eagerly (observations normalised in numpy when statistics are given);
the action is torch's own ``mode`` of the distribution (clipped to a Box's bounds, as
CleanRL's ClipAction does), log-probabilities are torch's ``log_prob`` summed per row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from export.actor_critic.normalization import NormStats
from export.actor_critic.source import Observations, SampledLogProb
from export.modules import distributions
from kernel.distributions import DistributionKind
from kernel.memory import Memory
from kernel.spaces import Box, Leaf


@dataclass(frozen=True)
class TorchReference:
    module: nn.Module
    method: str
    kind: DistributionKind
    norm: NormStats | None
    action_space: Leaf
    output_names: list[str]  # action, parameters..., value

    def outputs(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
    ) -> dict[str, np.ndarray]:
        distribution, value = self._call(observations)
        values = answered(distribution, value, self.kind, self.action_space)
        return dict(zip(self.output_names, values, strict=True))

    def sampled_log_prob(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
        seed: int,
    ) -> SampledLogProb:
        return sampled(lambda: self._call(observations)[0], self.kind, seed)

    def _call(self, observations: Observations) -> tuple[Any, Tensor]:
        with torch.no_grad(), distributions.no_argument_validation():
            distribution, value = getattr(self.module, self.method)(
                module_input(observations, self.norm)
            )
        return distribution, value


def module_input(observations: Observations, norm: NormStats | None) -> Tensor:
    """Raw observations as a CleanRL module takes them: normalised, float32."""
    x = observations[None]
    if norm is not None:
        x = norm.apply(None, x)
    return torch.as_tensor(x, dtype=torch.float32)


def answered(distribution: Any, value: Tensor, kind: DistributionKind, space: Leaf) -> list[Any]:
    """The source's outputs from its distribution and value: the mode (clipped to a Box's
    bounds, as CleanRL's ClipAction does), the distribution's parameters, value [B]."""
    action = distributions.mode(distribution, kind).numpy()
    if isinstance(space, Box):
        action = np.clip(action, space.low_array, space.high_array).astype(np.float32)
    parameters = [p.numpy() for p in distributions.parameters(distribution, kind)]
    return [action, *parameters, value.reshape(-1).numpy()]


def sampled(
    distribution_of: Callable[[], Any], kind: DistributionKind, seed: int
) -> SampledLogProb:
    """Actions drawn from the distribution ``distribution_of`` gives (torch seeded with
    ``seed`` while it runs and draws), and torch's log-probabilities of them."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        distribution = distribution_of()
        actions = distributions.sample(distribution, kind)
    log_prob = distributions.log_prob(distribution, kind, actions)
    if kind is DistributionKind.DIAG_GAUSSIAN:
        actions = actions.reshape(len(actions), -1)
    return SampledLogProb(actions.numpy(), log_prob.numpy())
