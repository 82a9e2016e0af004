"""The core of an SB3 actor-critic graph: the policy's own modules, as its forward pass runs them.

``extract_features`` (SB3's preprocessing: /255 for images, one-hot for discrete
observations) -> ``mlp_extractor`` -> ``action_net`` and ``value_net``; for a Gaussian
policy the state-independent ``log_std`` is broadcast to the batch.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from export.actor_critic.graph import Parameters


class Sb3Core(nn.Module):
    def __init__(self, policy: Any, keys: list[str | None], gaussian: bool) -> None:
        super().__init__()
        self.policy = policy
        self.keys = keys
        self.gaussian = gaussian

    def forward(self, inputs: list[Tensor]) -> tuple[Parameters, Tensor]:
        latent_pi, latent_vf = self._latents(sb3_observation(self.keys, inputs))
        first = self.policy.action_net(latent_pi)
        value = self.policy.value_net(latent_vf).squeeze(-1)
        if self.gaussian:
            return (first, self.policy.log_std.expand_as(first)), value
        return (first,), value

    def _latents(self, observation: Tensor | dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        features = self.policy.extract_features(observation)
        if self.policy.share_features_extractor:
            latent_pi, latent_vf = self.policy.mlp_extractor(features)
            return latent_pi, latent_vf
        pi_features, vf_features = features
        extractor = self.policy.mlp_extractor
        return extractor.forward_actor(pi_features), extractor.forward_critic(vf_features)


def sb3_observation(keys: list[str | None], inputs: list[Tensor]) -> Tensor | dict[str, Tensor]:
    """The graph's preprocessed inputs as an SB3 policy takes them: one tensor, or a dict."""
    if keys == [None]:
        return inputs[0]
    return {str(key): x for key, x in zip(keys, inputs, strict=True)}
