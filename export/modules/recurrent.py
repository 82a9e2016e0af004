"""A CleanRL-style recurrent torch module (``ppo_atari_lstm``'s Agent): ``--lstm ATTR``.

The module's method is called as CleanRL's ``get_action_and_value`` calls ``get_states``::

    distribution, value, (h, c) = module.method(obs, (h, c), done)

with states ``[layers, B, hidden]`` as its ``nn.LSTM`` (the attribute ``ATTR``) takes them,
and ``done`` the float episode starts (CleanRL's ``next_done``: 1.0 resets the row's state).
The graph runs the module's own method (:func:`method_step`, in the shared
:class:`~export.actor_critic.recurrent_core.RecurrentCore`) on a shallow copy of the module
whose ``ATTR`` is a :class:`~export.actor_critic.lstm.SteppedLSTM` over the same weights
(torch.export cannot trace ``nn.LSTM``); the reference runs the module itself, ``nn.LSTM``
and all. The memory is the LSTM's ``h`` then ``c``, each ``[layers, hidden]`` per row.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from export.actor_critic.graph import Parameters
from export.actor_critic.lstm import SteppedLSTM, as_lstm_takes, check_steppable, state_rows
from export.actor_critic.normalization import NormStats
from export.actor_critic.source import Observations, SampledLogProb
from export.errors import ExportError
from export.modules import distributions
from export.modules.reference import answered, module_input, sampled
from kernel.contract import StateLayout, StateSegment
from kernel.distributions import DistributionKind
from kernel.memory import Memory
from kernel.spaces import Leaf


def the_lstm(module: nn.Module, attr: str) -> nn.LSTM:
    lstm = getattr(module, attr, None)
    if not isinstance(lstm, nn.LSTM):
        found = type(lstm).__name__ if lstm is not None else "nothing"
        raise ExportError(
            f"--lstm {attr}: {type(module).__name__}.{attr} is {found}, not an nn.LSTM; name "
            "the module's own nn.LSTM attribute (CleanRL's agents call it lstm)"
        )
    check_steppable(lstm, f"--lstm {attr}")
    return lstm


def state_layout(lstm: nn.LSTM, attr: str) -> StateLayout:
    return StateLayout(
        segments=[
            StateSegment(name=f"{attr}.{part}", layers=lstm.num_layers, hidden=lstm.hidden_size)
            for part in ("h", "c")
        ]
    )


def stepped(module: nn.Module, attr: str) -> nn.Module:
    """A shallow copy of ``module`` (the same weights) whose LSTM is stepped in the graph."""
    copied = copy.copy(module)
    copied._modules = OrderedDict(module._modules)
    copied._modules[attr] = SteppedLSTM(the_lstm(module, attr))
    return copied


def _pair(state: Tensor, layout: StateLayout) -> tuple[Tensor, Tensor]:
    """A [B, size] state as the (h, c) the module's LSTM takes, each [layers, B, hidden]."""
    h, c = as_lstm_takes(state, layout)
    return h, c


def method_step(
    module: nn.Module,
    inputs: list[Tensor],
    held: list[Tensor],
    episode_start: Tensor,
    *,
    method: str,
    kind: DistributionKind,
) -> tuple[Parameters, Tensor, list[Tensor]]:
    """The stepped module's method as a
    :data:`~export.actor_critic.recurrent_core.RecurrentStep`. The method takes and returns
    the states as its ``nn.LSTM`` does, [layers, B, hidden], and zeroes the rows that start
    an episode itself (``done`` is a float, as CleanRL's ``next_done``)."""
    taken = tuple(s.transpose(0, 1).contiguous() for s in held)
    with distributions.no_argument_validation():
        distribution, value, (h, c) = getattr(module, method)(
            inputs[0].float(), taken, episode_start.float()
        )
        parameters = distributions.parameters(distribution, kind)
    return parameters, value.reshape(value.shape[0]), [h.transpose(0, 1), c.transpose(0, 1)]


@dataclass(frozen=True)
class TorchRecurrentReference:
    """The module itself (its nn.LSTM included) on the same observations and memory."""

    module: nn.Module
    method: str
    kind: DistributionKind
    norm: NormStats | None
    action_space: Leaf
    layout: StateLayout
    output_names: list[str]  # action, parameters..., value, next_state

    def outputs(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
    ) -> dict[str, np.ndarray]:
        distribution, value, (h, c) = self._call(observations, memory)
        values = answered(distribution, value, self.kind, self.action_space)
        values.append(state_rows([h, c]).numpy())
        return dict(zip(self.output_names, values, strict=True))

    def sampled_log_prob(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
        seed: int,
    ) -> SampledLogProb:
        return sampled(lambda: self._call(observations, memory)[0], self.kind, seed)

    def _call(self, observations: Observations, memory: Memory | None) -> Any:
        assert memory is not None, "a recurrent policy steps with its memory"
        state = _pair(torch.as_tensor(memory.state), self.layout)
        done = torch.as_tensor(memory.episode_start, dtype=torch.float32)
        with torch.no_grad(), distributions.no_argument_validation():
            return getattr(self.module, self.method)(
                module_input(observations, self.norm), state, done
            )


def check_method(module: nn.Module, method: str, layout: StateLayout, batch: Tensor) -> None:
    """The method takes (obs, (h, c), done) and returns (distribution, value, (h, c)) of the
    LSTM's shapes."""
    rows = len(batch)
    zeros = torch.zeros(rows, layout.size)
    with torch.no_grad(), distributions.no_argument_validation():
        try:
            returned = getattr(module, method)(batch, _pair(zeros, layout), torch.ones(rows))
        except Exception as exc:  # the user's code may raise anything
            raise ExportError(
                f"--method {method}: calling it as method(obs, (h, c), done) on {rows} "
                f"observations failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            ) from None
    shapes = _state_shapes(returned)
    first = layout.segments[0]
    expected = (first.layers, rows, first.hidden)
    if shapes != [expected, expected]:
        raise ExportError(
            f"--method {method}: with --lstm it must return (distribution, value, (h, c)), "
            f"h and c shaped {list(expected)} as the LSTM returns them; got "
            f"{type(returned).__name__}" + (f" with states {shapes}" if shapes else "")
        )


def _state_shapes(returned: Any) -> list[tuple[int, ...]]:
    if not isinstance(returned, tuple | list) or len(returned) != 3:
        return []
    state = returned[2]
    if not isinstance(state, tuple | list) or len(state) != 2:
        return []
    return [tuple(s.shape) for s in state if isinstance(s, Tensor)]
