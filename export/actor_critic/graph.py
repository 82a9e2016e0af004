"""The exported graph: raw observations in; action, distribution parameters and value out.

``PolicyGraph`` chains three parts that every actor-critic source provides:

1. one preprocessing pipeline per observation input (normalisation, HWC to CHW);
2. a *core*, the source's own network, mapping preprocessed observations to the
   distribution's parameters (``(logits,)`` or ``(mean, log_std)``) and the value ``[B]``;
3. a head computing the deterministic action from the first parameter.

``RecurrentPolicyGraph`` is a ``PolicyGraph`` whose core also takes and returns the
policy's memory (``state`` and ``episode_start`` inputs, a ``next_state`` output).

``ActorGraph`` is for policies whose network computes its action itself (off-policy
actors, Q-networks): the pipelines, then a core that returns every output in
``output_specs`` order.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

Parameters = tuple[Tensor, ...]
ILLEGAL_LOGIT = -1e8  # sb3-contrib's HUGE_NEG


def _prepared(pipelines: nn.ModuleList, inputs: tuple[Tensor, ...]) -> list[Tensor]:
    return [pipeline(x) for pipeline, x in zip(pipelines, inputs, strict=True)]


class PolicyGraph(nn.Module):
    def __init__(self, pipelines: nn.ModuleList, core: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.pipelines = pipelines
        self.core = core
        self.head = head

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        parameters, value = self.core(_prepared(self.pipelines, inputs))
        return (self.head(parameters[0]), *parameters, value)


class MaskedPolicyGraph(PolicyGraph):
    """A policy graph whose last input is an action mask (bool [B, n]): the logits of
    illegal actions are set to -1e8 before the action is taken from them, as sb3-contrib's
    ``MaskableCategorical`` sets them, so no illegal action is chosen nor sampled."""

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        *observations, mask = inputs
        parameters, value = self.core(_prepared(self.pipelines, tuple(observations)))
        logits = torch.where(mask, parameters[0], torch.full_like(parameters[0], ILLEGAL_LOGIT))
        return (self.head(logits), logits, value)


class RecurrentPolicyGraph(PolicyGraph):
    """Inputs: the observations, then ``state`` (float32 [B, size]) and ``episode_start``
    (bool [B]); outputs: action, parameters, value, then the next state. The core zeroes
    the state of rows that start an episode, as the source does."""

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        *observations, state, episode_start = inputs
        prepared = _prepared(self.pipelines, tuple(observations))
        parameters, value, next_state = self.core(prepared, state, episode_start)
        return (self.head(parameters[0]), *parameters, value, next_state)


class ActorGraph(nn.Module):
    def __init__(self, pipelines: nn.ModuleList, core: nn.Module) -> None:
        super().__init__()
        self.pipelines = pipelines
        self.core = core

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        outputs: tuple[Tensor, ...] = self.core(_prepared(self.pipelines, inputs))
        return outputs
