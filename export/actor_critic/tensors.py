"""The exported graph's interface: tensor names, dtypes, shapes and roles.

Inputs are ``obs`` (or ``obs.<key>`` per key of a Dict space) in the dtype
:func:`kernel.spaces.input_dtype` gives, then a masked policy's ``action_mask``, then a
recurrent policy's ``state`` and ``episode_start``; outputs are ``action``, the distribution's
parameters (``logits``, or ``mean`` and ``log_std``; a Q-network's ``q_values``), ``value``
and a recurrent policy's ``next_state``, each with a leading batch axis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from kernel.contract import StateLayout, TensorRole, TensorSpec
from kernel.distributions import DistributionKind
from kernel.memory import Memory
from kernel.spaces import (
    Box,
    Dict,
    Discrete,
    Leaf,
    MultiBinary,
    MultiDiscrete,
    input_dtype,
    leaf_shape,
    leaves,
)

BATCH = "batch"
MASK_INPUT = "action_mask"
STATE_INPUT = "state"
EPISODE_START_INPUT = "episode_start"
NEXT_STATE_OUTPUT = "next_state"


def input_name(key: str | None) -> str:
    return "obs" if key is None else f"obs.{key}"


def input_specs(
    space: Leaf | Dict,
    action_space: Leaf,
    *,
    action_masks: bool,
    state: StateLayout | None = None,
) -> list[TensorSpec]:
    """The observation inputs, then the action mask (bool [B, n]) when the policy takes one,
    then a recurrent policy's memory (float32 [B, size]) and episode starts (bool [B])."""
    specs = [
        TensorSpec(
            name=input_name(key),
            role=TensorRole.OBSERVATION,
            dtype=str(input_dtype(leaf)),
            shape=[BATCH, *leaf_shape(leaf)],
            key=key,
        )
        for key, leaf in leaves(space)
    ]
    if action_masks:
        width: list[int | str] = [BATCH, parameter_width(action_space)]
        specs.append(
            TensorSpec(name=MASK_INPUT, role=TensorRole.ACTION_MASK, dtype="bool", shape=width)
        )
    if state is not None:
        specs.append(_spec(STATE_INPUT, TensorRole.STATE, "float32", (state.size,)))
        specs.append(_spec(EPISODE_START_INPUT, TensorRole.EPISODE_START, "bool", ()))
    return specs


def graph_feeds(
    observations: Mapping[str | None, np.ndarray],
    action_masks: np.ndarray | None,
    memory: Memory | None = None,
) -> dict[str, np.ndarray]:
    """onnxruntime's feeds: each observation leaf by its input name, the masks, the memory."""
    feeds = {input_name(key): array for key, array in observations.items()}
    if action_masks is not None:
        feeds[MASK_INPUT] = action_masks
    if memory is not None:
        feeds[STATE_INPUT] = memory.state
        feeds[EPISODE_START_INPUT] = memory.episode_start
    return feeds


def output_specs(
    action_space: Leaf,
    kind: DistributionKind,
    *,
    value: bool = True,
    state: StateLayout | None = None,
) -> list[TensorSpec]:
    """action, then the distribution parameters (a deterministic policy over discrete
    actions: its Q-values), then value (unless the policy has none, as an actor exported
    without its critic), then a recurrent policy's next state: the order the graph returns."""
    action_dtype = "float32" if isinstance(action_space, Box) else "int64"
    action = _spec("action", TensorRole.ACTION, action_dtype, leaf_shape(action_space))
    values = [_spec("value", TensorRole.VALUE, "float32", ())] if value else []
    memory = (
        []
        if state is None
        else [_spec(NEXT_STATE_OUTPUT, TensorRole.NEXT_STATE, "float32", (state.size,))]
    )
    return [action, *_parameter_specs(action_space, kind), *values, *memory]


def _parameter_specs(action_space: Leaf, kind: DistributionKind) -> list[TensorSpec]:
    width = (parameter_width(action_space),)
    if kind is DistributionKind.DETERMINISTIC:
        if isinstance(action_space, Box):
            return []
        return [_spec("q_values", TensorRole.Q_VALUES, "float32", width)]
    if kind in (DistributionKind.DIAG_GAUSSIAN, DistributionKind.SQUASHED_DIAG_GAUSSIAN):
        return [
            _spec("mean", TensorRole.MEAN, "float32", width),
            _spec("log_std", TensorRole.LOG_STD, "float32", width),
        ]
    return [_spec("logits", TensorRole.LOGITS, "float32", width)]


def parameter_width(action_space: Leaf) -> int:
    """Columns of the logits (or of mean and log_std) for one observation."""
    if isinstance(action_space, Discrete | MultiBinary):
        return action_space.n
    if isinstance(action_space, MultiDiscrete):
        return sum(action_space.nvec)
    return math.prod(action_space.shape)


def _spec(name: str, role: TensorRole, dtype: str, shape: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(name=name, role=role, dtype=dtype, shape=[BATCH, *shape])
