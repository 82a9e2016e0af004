"""CleanRL-style agents for the torch exporter tests (the shape of CleanRL's ppo*.py Agent).

Each has ``get_dist_and_value(x) -> (distribution, value)``; the ``make_*`` functions are the
zero-argument factories ``rlserve export torch FILE:make_...`` calls.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Bernoulli, Categorical, Independent, Normal


def layer(inputs: int, outputs: int, std: float = float(np.sqrt(2))) -> nn.Linear:
    linear = nn.Linear(inputs, outputs)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, 0.0)
    return linear


def mlp(inputs: int, outputs: int, std: float) -> nn.Sequential:
    return nn.Sequential(
        layer(inputs, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, outputs, std)
    )


class DiscreteAgent(nn.Module):
    def __init__(self, observations: int, actions: int) -> None:
        super().__init__()
        self.critic = mlp(observations, 1, 1.0)
        self.actor = mlp(observations, actions, 0.01)

    def get_dist_and_value(self, x: Tensor) -> tuple[Categorical, Tensor]:
        return Categorical(logits=self.actor(x)), self.critic(x)


class ContinuousAgent(nn.Module):
    def __init__(self, observations: int, actions: int) -> None:
        super().__init__()
        self.critic = mlp(observations, 1, 1.0)
        self.actor_mean = mlp(observations, actions, 0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, actions), -0.5))

    def get_dist_and_value(self, x: Tensor) -> tuple[Normal, Tensor]:
        mean = self.actor_mean(x)
        std = torch.exp(self.actor_logstd.expand_as(mean))
        return Normal(mean, std), self.critic(x)


class IndependentGaussianAgent(ContinuousAgent):
    def get_dist_and_value(self, x: Tensor) -> tuple[Independent, Tensor]:  # type: ignore[override]
        normal, value = super().get_dist_and_value(x)
        return Independent(normal, 1), value.squeeze(-1)


class BinaryAgent(DiscreteAgent):
    def get_dist_and_value(self, x: Tensor) -> tuple[Independent, Tensor]:  # type: ignore[override]
        return Independent(Bernoulli(logits=self.actor(x)), 1), self.critic(x)


class MultiDiscreteAgent(nn.Module):
    def __init__(self, observations: int, nvec: list[int]) -> None:
        super().__init__()
        self.nvec = nvec
        self.critic = mlp(observations, 1, 1.0)
        self.actor = mlp(observations, sum(nvec), 0.5)

    def get_dist_and_value(self, x: Tensor) -> tuple[list[Categorical], Tensor]:
        parts = torch.split(self.actor(x), self.nvec, dim=-1)
        return [Categorical(logits=p) for p in parts], self.critic(x)


def make_cartpole_agent() -> DiscreteAgent:
    torch.manual_seed(0)
    return DiscreteAgent(4, 2)


def make_pendulum_agent() -> ContinuousAgent:
    torch.manual_seed(0)
    return ContinuousAgent(3, 1)


def make_independent_gaussian_agent() -> IndependentGaussianAgent:
    torch.manual_seed(0)
    return IndependentGaussianAgent(3, 2)


def make_binary_agent() -> BinaryAgent:
    torch.manual_seed(0)
    return BinaryAgent(3, 3)


def make_multidiscrete_agent() -> MultiDiscreteAgent:
    torch.manual_seed(0)
    return MultiDiscreteAgent(4, [3, 2])


pendulum_agent = make_pendulum_agent()  # an instance, for the MODULE:INSTANCE form


# The shape of CleanRL's off-policy modules (dqn.py, td3_continuous_action.py,
# sac_continuous_action.py): what their forward returns, on Pendulum's and CartPole's spaces.
LOG_STD_MAX, LOG_STD_MIN = 2, -5


class QNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.network = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)


class Td3Actor(nn.Module):
    action_scale: Tensor
    action_bias: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.fc_mu = nn.Linear(3, 16), nn.Linear(16, 1)
        self.register_buffer("action_scale", torch.tensor([2.0]))  # Pendulum: [-2, 2]
        self.register_buffer("action_bias", torch.tensor([0.0]))

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.fc_mu(torch.relu(self.fc(x)))) * self.action_scale + self.action_bias


class SacActor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.fc_mean, self.fc_logstd = nn.Linear(3, 16), nn.Linear(16, 1), nn.Linear(16, 1)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.relu(self.fc(x))
        log_std = torch.tanh(self.fc_logstd(x))
        return self.fc_mean(x), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)


def make_q_network() -> QNetwork:
    torch.manual_seed(0)
    return QNetwork()


def make_td3_actor() -> Td3Actor:
    torch.manual_seed(0)
    return Td3Actor()


def make_sac_actor() -> SacActor:
    torch.manual_seed(0)
    return SacActor()


class LstmAgent(nn.Module):
    """CleanRL's ppo_atari_lstm Agent with an MLP torso: its get_states unchanged, and the
    method rlserve calls, as get_action_and_value would be without sampling."""

    def __init__(self, observations: int, actions: int, hidden: int = 32) -> None:
        super().__init__()
        self.network = nn.Sequential(layer(observations, 64), nn.ReLU())
        self.lstm = nn.LSTM(64, hidden)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer(hidden, actions, std=0.01)
        self.critic = layer(hidden, 1, std=1.0)

    def get_states(
        self, x: torch.Tensor, lstm_state: tuple[torch.Tensor, torch.Tensor], done: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        hidden = self.network(x)
        batch_size = lstm_state[0].shape[1]
        hidden = hidden.reshape((-1, batch_size, self.lstm.input_size))
        done = done.reshape((-1, batch_size))
        new_hidden = []
        for h, d in zip(hidden, done, strict=True):
            h, lstm_state = self.lstm(
                h.unsqueeze(0),
                (
                    (1.0 - d).view(1, -1, 1) * lstm_state[0],
                    (1.0 - d).view(1, -1, 1) * lstm_state[1],
                ),
            )
            new_hidden += [h]
        return torch.flatten(torch.cat(new_hidden), 0, 1), lstm_state

    def get_dist_and_value(
        self, x: torch.Tensor, lstm_state: tuple[torch.Tensor, torch.Tensor], done: torch.Tensor
    ) -> tuple[Categorical, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        hidden, lstm_state = self.get_states(x, lstm_state, done)
        return Categorical(logits=self.actor(hidden)), self.critic(hidden), lstm_state


def make_lstm_agent() -> LstmAgent:
    torch.manual_seed(0)
    return LstmAgent(4, 2)
