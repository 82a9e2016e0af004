"""Stable-Baselines3's own answers for raw observations: what parity holds the graph to.

Raw observations are normalised by the VecNormalize object's own ``normalize_obs`` and
transposed as VecTransposeImage would; actions come from ``model.predict(deterministic=True)``,
the value from ``policy.predict_values``, the distribution's parameters from the modules
``policy.get_distribution`` runs, and log-probabilities from ``policy.evaluate_actions``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from export.actor_critic.graph import ILLEGAL_LOGIT
from export.actor_critic.source import Observations, SampledLogProb
from kernel.memory import Memory


@dataclass(frozen=True)
class Sb3Reference:
    model: Any  # PPO, A2C or MaskablePPO
    vecnormalize: Any | None  # the unpickled VecNormalize, when one was given
    chw_keys: set[str | None]  # leaves VecTransposeImage turned from HWC into CHW
    output_names: list[str]  # action, parameters..., value
    gaussian: bool

    def outputs(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
    ) -> dict[str, np.ndarray]:
        prepared = self._policy_input(observations)
        masked = {} if action_masks is None else {"action_masks": action_masks}
        actions, _ = self.model.predict(prepared, deterministic=True, **masked)
        policy = self.model.policy
        with torch.no_grad():
            obs, _ = policy.obs_to_tensor(prepared)
            first = self._first_parameter(obs)
            if action_masks is not None:  # as MaskableCategorical masks them
                first = torch.where(torch.as_tensor(action_masks), first, ILLEGAL_LOGIT)
            value = policy.predict_values(obs).flatten().numpy()
        parameters = [first.numpy()]
        if self.gaussian:
            parameters.append(np.broadcast_to(policy.log_std.detach().numpy(), first.shape))
        values = [np.asarray(actions), *parameters, value]
        return dict(zip(self.output_names, values, strict=True))

    def sampled_log_prob(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
        seed: int,
    ) -> SampledLogProb:
        policy = self.model.policy
        masked = {} if action_masks is None else {"action_masks": action_masks}
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            obs, _ = policy.obs_to_tensor(self._policy_input(observations))
            actions = policy.get_distribution(obs, **masked).sample()
            _, log_prob, _ = policy.evaluate_actions(obs, actions, **masked)
        return SampledLogProb(actions.numpy(), log_prob.numpy())

    def _first_parameter(self, obs: Any) -> torch.Tensor:
        """action_net's output: logits, or the Gaussian mean (as get_distribution computes it)."""
        from stable_baselines3.common.policies import BaseModel

        policy = self.model.policy
        features = BaseModel.extract_features(policy, obs, policy.pi_features_extractor)
        out: torch.Tensor = policy.action_net(policy.mlp_extractor.forward_actor(features))
        return out

    def _policy_input(self, observations: Observations) -> Any:
        return policy_input(observations, self.vecnormalize, self.chw_keys)


def policy_input(
    observations: Observations, vecnormalize: Any | None, chw_keys: set[str | None]
) -> Any:
    """Raw observations as the SB3 policy saw them in training: normalised by the
    VecNormalize object's own ``normalize_obs``, image leaves transposed to CHW."""
    as_sb3: Any = (
        observations[None] if None in observations else {str(k): v for k, v in observations.items()}
    )
    if vecnormalize is not None:
        as_sb3 = vecnormalize.normalize_obs(as_sb3)
    if isinstance(as_sb3, dict):
        return {k: _layout(k, v, chw_keys) for k, v in as_sb3.items()}
    return _layout(None, as_sb3, chw_keys)


def _layout(key: str | None, batch: np.ndarray, chw_keys: set[str | None]) -> np.ndarray:
    return np.transpose(batch, (0, 3, 1, 2)) if key in chw_keys else batch
