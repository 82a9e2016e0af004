"""The core of every recurrent policy's graph: one time step of the source's network, its
memory an explicit input (``state``) and output (``next_state``).

The contract lays the memory out as one float32 row per observation, its segments one after
another (``StateLayout``). Each source knows only how its own network steps, so the rows are
taken apart and put back together here, once: a source's :data:`RecurrentStep` gets the
layout's segments, each ``[B, layers, hidden]``, and returns the next ones in the same order,
and every graph's ``next_state`` is laid out as its contract says, whichever source made it.

A step resets the memory as its source does: sb3-contrib's policy steps its LSTMs bare, so
its step zeroes the rows that start an episode; a CleanRL-style module takes the episode
starts and zeroes them itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from export.actor_critic.graph import Parameters
from export.actor_critic.lstm import segments
from kernel.contract import StateLayout

RecurrentStep = Callable[
    [Any, list[Tensor], list[Tensor], Tensor], tuple[Parameters, Tensor, list[Tensor]]
]
"""``step(network, inputs, held, episode_start)`` -> (parameters, value [B], the next
memory): ``held`` and the next memory are the layout's segments, each [B, layers, hidden];
``episode_start`` is bool [B]."""


class RecurrentCore(nn.Module):
    """A source's step over its network, from ``state`` [B, size] to ``next_state`` [B, size].

    The network is held under the name its source's other cores give it (``policy`` for
    SB3, ``module`` for torch modules): the graph names its initializers after it
    (``core.policy.*``), and reweighting a graph finds its tensors by those names.
    """

    def __init__(
        self, network: nn.Module, step: RecurrentStep, layout: StateLayout, *, network_name: str
    ) -> None:
        super().__init__()
        self.add_module(network_name, network)
        self.network_name = network_name
        self.step = step
        self.layout = layout

    def forward(
        self, inputs: list[Tensor], state: Tensor, episode_start: Tensor
    ) -> tuple[Parameters, Tensor, Tensor]:
        network = self.get_submodule(self.network_name)
        held = segments(state, self.layout)
        parameters, value, following = self.step(network, inputs, held, episode_start)
        next_state = torch.cat([s.reshape(s.shape[0], -1) for s in following], dim=1)
        return parameters, value, next_state
