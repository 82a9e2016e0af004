"""sb3-contrib's RecurrentPPO (MlpLstm, CnnLstm, MultiInputLstm policies): one step of the
policy, with its LSTM memory as explicit inputs and outputs.

The graph's core is the shared :class:`~export.actor_critic.recurrent_core.RecurrentCore`
over :func:`policy_step`, one time step of the policy's own modules, as
``RecurrentActorCriticPolicy.forward`` runs them for a sequence of length 1: features, the
actor's LSTM (and the critic's, when it has its own), the MLP extractor, ``action_net`` and
``value_net``. The LSTM step is written out over the module's own weights
(:func:`export.actor_critic.lstm.lstm_step`). Rows whose ``episode_start`` is true have
their state zeroed first, as the source's ``(1 - episode_start) * state`` does.

The memory is one float32 row per observation (:func:`state_layout`): the actor's hidden and
cell states, then the critic's when it has its own LSTM, each ``[layers, hidden]``.

:class:`RecurrentReference` is the source's own computation of the same step: ``predict``
for the action (with the actor's state, as users call it), the source's own
``_process_sequence`` and heads for the distribution's parameters, and ``forward`` for the
value and the next state of both LSTMs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from export.actor_critic.graph import Parameters
from export.actor_critic.lstm import as_lstm_takes, check_steppable, lstm_step, state_rows
from export.actor_critic.source import Observations, SampledLogProb
from export.sb3.graph import sb3_observation
from export.sb3.reference import policy_input
from kernel.contract import StateLayout, StateSegment
from kernel.memory import Memory


def state_layout(policy: Any) -> StateLayout:
    """The policy's memory: the actor LSTM's h and c, then the critic LSTM's, if any."""
    networks = [("actor", policy.lstm_actor)]
    if policy.lstm_critic is not None:
        networks.append(("critic", policy.lstm_critic))
    laid_out = []
    for name, lstm in networks:
        check_steppable(lstm, f"the {name} LSTM")
        for part in ("h", "c"):
            laid_out.append(
                StateSegment(name=f"{name}.{part}", layers=lstm.num_layers, hidden=lstm.hidden_size)
            )
    return StateLayout(segments=laid_out)


def policy_step(
    policy: Any,
    inputs: list[Tensor],
    held: list[Tensor],
    episode_start: Tensor,
    *,
    keys: list[str | None],
    gaussian: bool,
) -> tuple[Parameters, Tensor, list[Tensor]]:
    """The policy's :data:`~export.actor_critic.recurrent_core.RecurrentStep`: parameters,
    value [B] and the next memory, each segment [B, layers, hidden]."""
    features = policy.extract_features(sb3_observation(keys, inputs))
    pi_features, vf_features = (features, features) if policy.share_features_extractor else features
    latent_pi, latent_vf, following = _latents(
        policy, pi_features, vf_features, _zeroed_at_starts(held, episode_start)
    )
    first = policy.action_net(policy.mlp_extractor.forward_actor(latent_pi))
    value = policy.value_net(policy.mlp_extractor.forward_critic(latent_vf)).squeeze(-1)
    parameters = (first, policy.log_std.expand_as(first)) if gaussian else (first,)
    return parameters, value, following


def _zeroed_at_starts(held: list[Tensor], episode_start: Tensor) -> list[Tensor]:
    """The memory with the rows that start an episode zeroed. The source's
    ``_process_sequence`` zeroes them inside its LSTM call; the step runs the LSTMs bare."""
    keep = (~episode_start).to(held[0].dtype).unsqueeze(-1)
    return [s * keep.unsqueeze(-1) for s in held]


def _latents(
    policy: Any, pi_features: Tensor, vf_features: Tensor, held: list[Tensor]
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """The actor's and the critic's latents, and both LSTMs' next h and c. The critic has
    its own LSTM, shares the actor's, or has none (a linear layer in its place)."""
    latent_pi, *following = lstm_step(policy.lstm_actor, pi_features, *held[:2])
    if policy.lstm_critic is not None:
        latent_vf, *critic = lstm_step(policy.lstm_critic, vf_features, *held[2:])
        return latent_pi, latent_vf, following + critic
    if policy.shared_lstm:
        return latent_pi, latent_pi, following
    return latent_pi, policy.critic(vf_features), following


@dataclass(frozen=True)
class RecurrentReference:
    model: Any  # RecurrentPPO
    vecnormalize: Any | None
    chw_keys: set[str | None]
    output_names: list[str]  # action, parameters..., value, next_state
    layout: StateLayout
    gaussian: bool

    def outputs(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
    ) -> dict[str, np.ndarray]:
        assert memory is not None, "a recurrent policy steps with its memory"
        prepared = policy_input(observations, self.vecnormalize, self.chw_keys)
        pi, vf = self._states(memory)
        actions, _ = self.model.predict(
            prepared,
            state=tuple(s.numpy() for s in pi),
            episode_start=memory.episode_start,
            deterministic=True,
        )
        policy = self.model.policy
        starts = torch.as_tensor(memory.episode_start, dtype=torch.float32)
        with torch.no_grad():
            obs, _ = policy.obs_to_tensor(prepared)
            first = self._first_parameter(obs, pi, starts)
            _, value, _, following = policy.forward(
                obs, self._rnn_states(pi, vf), starts, deterministic=True
            )
        parameters = [first.numpy()]
        if self.gaussian:
            parameters.append(np.broadcast_to(policy.log_std.detach().numpy(), first.shape))
        kept = [*following.pi, *following.vf][: len(self.layout.segments)]
        next_state = state_rows(list(kept)).numpy()
        values = [np.asarray(actions), *parameters, value.flatten().numpy(), next_state]
        return dict(zip(self.output_names, values, strict=True))

    def sampled_log_prob(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
        seed: int,
    ) -> SampledLogProb:
        assert memory is not None, "a recurrent policy steps with its memory"
        policy = self.model.policy
        pi, _ = self._states(memory)
        starts = torch.as_tensor(memory.episode_start, dtype=torch.float32)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            prepared = policy_input(observations, self.vecnormalize, self.chw_keys)
            obs, _ = policy.obs_to_tensor(prepared)
            distribution, _ = policy.get_distribution(obs, pi, starts)
            actions = distribution.sample()
            log_prob = distribution.log_prob(actions)
        return SampledLogProb(actions.numpy(), log_prob.numpy())

    def _first_parameter(self, obs: Any, pi: tuple[Tensor, Tensor], starts: Tensor) -> Tensor:
        """action_net's output (logits or the Gaussian mean), as get_distribution runs it."""
        from stable_baselines3.common.policies import BaseModel

        policy = self.model.policy
        features = BaseModel.extract_features(policy, obs, policy.pi_features_extractor)
        latent, _ = policy._process_sequence(features, pi, starts, policy.lstm_actor)
        out: Tensor = policy.action_net(policy.mlp_extractor.forward_actor(latent))
        return out

    def _states(self, memory: Memory) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor] | None]:
        """The memory as SB3 holds it: (h, c) per LSTM, each [layers, B, hidden]."""
        parts = as_lstm_takes(torch.as_tensor(memory.state), self.layout)
        pi = (parts[0], parts[1])
        return pi, (parts[2], parts[3]) if len(parts) == 4 else None

    def _rnn_states(self, pi: tuple[Tensor, Tensor], vf: tuple[Tensor, Tensor] | None) -> Any:
        from sb3_contrib.common.recurrent.type_aliases import RNNStates

        return RNNStates(pi, pi if vf is None else vf)
