"""A torch module's own answers for raw observations: what parity holds the graph to.

The method is called eagerly (observations normalised in numpy when statistics are given);
the action is torch's own ``mode`` of the distribution (clipped to a Box's bounds, as
CleanRL's ClipAction does), log-probabilities are torch's ``log_prob`` summed per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from export.actor_critic.normalization import NormStats
from export.actor_critic.source import Observations, SampledLogProb
from export.modules import distributions
from serve.actor_critic.memory import Memory
from serve.distributions import DistributionKind
from serve.spaces import Box, Leaf


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
        action = distributions.mode(distribution, self.kind).numpy()
        parameters = [p.numpy() for p in distributions.parameters(distribution, self.kind)]
        values = [self._clipped(action), *parameters, value.reshape(-1).numpy()]
        return dict(zip(self.output_names, values, strict=True))

    def sampled_log_prob(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
        seed: int,
    ) -> SampledLogProb:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            distribution, _ = self._call(observations)
            actions = distributions.sample(distribution, self.kind)
        log_prob = distributions.log_prob(distribution, self.kind, actions)
        if self.kind is DistributionKind.DIAG_GAUSSIAN:
            actions = actions.reshape(len(actions), -1)
        return SampledLogProb(actions.numpy(), log_prob.numpy())

    def _call(self, observations: Observations) -> tuple[Any, Tensor]:
        x = observations[None]
        if self.norm is not None:
            x = self.norm.apply(None, x)
        with torch.no_grad(), distributions.no_argument_validation():
            distribution, value = getattr(self.module, self.method)(
                torch.as_tensor(x, dtype=torch.float32)
            )
        return distribution, value

    def _clipped(self, action: np.ndarray) -> np.ndarray:
        if not isinstance(self.action_space, Box):
            return action
        low, high = self.action_space.low_array, self.action_space.high_array
        return np.clip(action, low, high).astype(np.float32)
