"""Stable-Baselines3's own answers for an off-policy checkpoint: what parity holds it to.

Actions come from ``model.predict(deterministic=True)``; SAC's (and TQC's) mean and log_std
from ``actor.get_action_dist_params``; values from ``policy.critic`` (the smaller critic;
TQC: the mean of its quantiles) on the actor's deterministic action in [-1, 1], or from the
largest Q-value; a DQN's Q-values from ``q_net``, a QR-DQN's as the means of
``quantile_net``'s quantiles. SAC's samples and their log-probabilities come from its own
``SquashedDiagGaussianDistribution``, computed in float64 from the pre-tanh sample (so that
the comparison measures the graph's parameters, not float32's rounding near +-1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from export.actor_critic.source import Observations, SampledLogProb
from export.sb3.checkpoint import PolicyFamily
from export.sb3.reference import policy_input
from kernel.memory import Memory


@dataclass(frozen=True)
class OffPolicyReference:
    model: Any  # SAC, TD3, DDPG or DQN
    family: PolicyFamily
    vecnormalize: Any | None
    chw_keys: set[str | None]
    output_names: list[str]  # action, [mean, log_std | q_values], value

    def outputs(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
    ) -> dict[str, np.ndarray]:
        prepared = policy_input(observations, self.vecnormalize, self.chw_keys)
        actions, _ = self.model.predict(prepared, deterministic=True)
        policy = self.model.policy
        with torch.no_grad():
            obs, _ = policy.obs_to_tensor(prepared)
            rest = self._rest(policy, obs)
        values = [np.asarray(actions), *(t.numpy() for t in rest)]
        return dict(zip(self.output_names, values, strict=True))

    def _rest(self, policy: Any, obs: Any) -> list[torch.Tensor]:
        family = self.family
        if family in (PolicyFamily.DQN, PolicyFamily.QRDQN):
            dqn = family is PolicyFamily.DQN
            q_values = policy.q_net(obs) if dqn else policy.quantile_net(obs).mean(dim=1)
            return [q_values, q_values.max(dim=-1).values]
        if family in (PolicyFamily.SAC, PolicyFamily.TQC):
            mean, log_std, _ = policy.actor.get_action_dist_params(obs)
            scaled = policy.actor(obs, deterministic=True)
            if family is PolicyFamily.TQC:  # quantiles [B, critics, quantiles]
                return [mean, log_std, policy.critic(obs, scaled).mean(dim=(1, 2))]
            return [mean, log_std, _smaller_critic(policy, obs, scaled)]
        return [_smaller_critic(policy, obs, policy.actor(obs))]


@dataclass(frozen=True)
class SacSampler:
    model: Any  # SAC or TQC
    vecnormalize: Any | None
    chw_keys: set[str | None]

    def sampled_log_prob(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
        seed: int,
    ) -> SampledLogProb:
        """Actions in [-1, 1] sampled by SAC's distribution, and their log-probabilities."""
        policy = self.model.policy
        prepared = policy_input(observations, self.vecnormalize, self.chw_keys)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            obs, _ = policy.obs_to_tensor(prepared)
            mean, log_std, _ = policy.actor.get_action_dist_params(obs)
            distribution = policy.actor.action_dist.proba_distribution(mean, log_std)
            gaussian = distribution.distribution.rsample().double()
            double = policy.actor.action_dist.proba_distribution(mean.double(), log_std.double())
            actions = torch.tanh(gaussian)
            log_prob = double.log_prob(actions, gaussian_actions=gaussian)
        return SampledLogProb(actions.numpy(), log_prob.numpy())


def _smaller_critic(policy: Any, obs: Any, scaled: torch.Tensor) -> torch.Tensor:
    values = torch.cat(policy.critic(obs, scaled), dim=1)
    return values.min(dim=1).values
