"""The recurrent core both sources share: the memory's rows in and out as the contract lays
them out, and the network under the name its weights have in the graph."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from export.actor_critic.graph import Parameters
from export.actor_critic.recurrent_core import RecurrentCore
from kernel.contract import StateLayout, StateSegment

LAYOUT = StateLayout(
    segments=[
        StateSegment(name="actor.h", layers=2, hidden=3),
        StateSegment(name="actor.c", layers=2, hidden=3),
        StateSegment(name="critic.h", layers=1, hidden=4),
        StateSegment(name="critic.c", layers=1, hidden=4),
    ]
)


def _plus_row_number(
    network: Any, inputs: list[Tensor], held: list[Tensor], episode_start: Tensor
) -> tuple[Parameters, Tensor, list[Tensor]]:
    assert [tuple(s.shape) for s in held] == [(3, 2, 3), (3, 2, 3), (3, 1, 4), (3, 1, 4)]
    rows = torch.arange(3.0).reshape(3, 1, 1)
    return (network(inputs[0]),), inputs[0].sum(dim=1), [s + rows for s in held]


def test_each_row_of_the_memory_comes_back_in_the_layouts_order() -> None:
    core = RecurrentCore(nn.Linear(2, 2), _plus_row_number, LAYOUT, network_name="policy")
    state = torch.randn(3, LAYOUT.size)
    _, _, next_state = core([torch.ones(3, 2)], state, torch.zeros(3, dtype=torch.bool))
    torch.testing.assert_close(next_state, state + torch.arange(3.0).reshape(3, 1))


def test_the_network_keeps_the_name_its_source_gives_it() -> None:
    """The graph's initializers are named after it, and reweighting finds them so."""
    for name in ("policy", "module"):
        core = RecurrentCore(nn.Linear(2, 2), _plus_row_number, LAYOUT, network_name=name)
        assert set(core.state_dict()) == {f"{name}.weight", f"{name}.bias"}
