"""The cores of off-policy SB3 graphs: SAC's, TD3's (and DDPG's) and DQN's own modules, and
sb3-contrib's TQC (SAC's actor, quantile critics) and QR-DQN (a quantile Q-network).

Each returns every output in ``output_specs`` order (an ``ActorGraph`` core):

- **SAC**: ``actor.get_action_dist_params`` gives the Gaussian's mean and (clamped)
  log_std before tanh; the action is ``tanh(mean)`` rescaled to the Box's bounds, as
  ``predict(deterministic=True)`` answers.
- **TD3, DDPG**: the actor's tanh output rescaled to the Box's bounds.
- **DQN**: the Q-network's values; the action is their argmax. **QR-DQN**: the Q-values are
  the means of each action's quantiles, as its ``_predict`` takes them.

The value of a continuous policy is the critics' estimate of its deterministic action,
``min_i Q_i(s, a)`` (the smaller critic, as SAC's and TD3's targets take it; TQC: the mean
of every critic's quantiles); a DQN's is ``max_a Q(s, a)``. The critics are run module by
module, as ``ContinuousCritic.forward`` runs them, without its gradient switch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import torch
from torch import Tensor, nn

from export.actor_critic.heads import Rescale
from export.sb3.graph import sb3_observation
from kernel.spaces import Box


class CriticValue(StrEnum):
    """How a policy's critics make one value of a state and action."""

    SMALLER = "smaller"  # SAC, TD3, DDPG: min over the critics' Q-values
    QUANTILE_MEAN = "quantile_mean"  # TQC: the mean of every critic's quantiles


def critic_value(
    critic: Any, observation: Tensor | dict[str, Tensor], scaled: Tensor, rule: CriticValue
) -> Tensor:
    """The critics' value of actions in [-1, 1], shape [B]."""
    features = critic.extract_features(observation, critic.features_extractor)
    joined = torch.cat([features, scaled], dim=1)
    values = torch.cat([q_net(joined) for q_net in critic.q_networks], dim=1)
    if rule is CriticValue.QUANTILE_MEAN:
        return values.mean(dim=1)
    return values.min(dim=1).values


class SacCore(nn.Module):
    """SAC's or TQC's squashed Gaussian actor (the same ``Actor`` interface)."""

    def __init__(self, policy: Any, keys: list[str | None], space: Box, rule: CriticValue) -> None:
        super().__init__()
        self.policy = policy
        self.keys = keys
        self.rescale = Rescale(space)
        self.rule = rule

    def forward(self, inputs: list[Tensor]) -> tuple[Tensor, ...]:
        observation = sb3_observation(self.keys, inputs)
        mean, log_std, _ = self.policy.actor.get_action_dist_params(observation)
        scaled = torch.tanh(mean)
        value = critic_value(self.policy.critic, observation, scaled, self.rule)
        return self.rescale(scaled), mean, log_std, value


class Td3Core(nn.Module):
    def __init__(self, policy: Any, keys: list[str | None], space: Box) -> None:
        super().__init__()
        self.policy = policy
        self.keys = keys
        self.rescale = Rescale(space)

    def forward(self, inputs: list[Tensor]) -> tuple[Tensor, ...]:
        observation = sb3_observation(self.keys, inputs)
        scaled = self.policy.actor(observation)
        value = critic_value(self.policy.critic, observation, scaled, CriticValue.SMALLER)
        return self.rescale(scaled), value


class DqnCore(nn.Module):
    def __init__(self, policy: Any, keys: list[str | None]) -> None:
        super().__init__()
        self.policy = policy
        self.keys = keys

    def forward(self, inputs: list[Tensor]) -> tuple[Tensor, ...]:
        q_values = self.q_values(sb3_observation(self.keys, inputs))
        return q_values.argmax(dim=-1), q_values, q_values.max(dim=-1).values

    def q_values(self, observation: Tensor | dict[str, Tensor]) -> Tensor:
        result: Tensor = self.policy.q_net(observation)
        return result


class QrDqnCore(DqnCore):
    def q_values(self, observation: Tensor | dict[str, Tensor]) -> Tensor:
        quantiles = self.policy.quantile_net(observation)
        return quantiles.mean(dim=1)  # [B, n_quantiles, n_actions] -> [B, n_actions]
