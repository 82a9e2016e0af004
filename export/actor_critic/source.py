"""What a source adapter (SB3, a torch module) hands to the export pipeline.

A :class:`PolicySource` is the graph to export plus a :class:`Reference`: the source
framework's own computation of the same outputs, which parity compares against onnxruntime;
and, for a policy with a distribution, a :class:`Sampler`: the source's own samples and
their log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from torch import nn

from export.actor_critic.tensors import output_specs
from kernel.contract import (
    Algorithm,
    DistributionSpec,
    Preprocessing,
    Source,
    StateLayout,
    TensorSpec,
)
from kernel.memory import Memory
from kernel.spaces import Dict, Leaf

# Raw environment observations, one array per leaf key (None: a space that is not a Dict).
Observations = dict[str | None, np.ndarray]


@dataclass(frozen=True)
class SampledLogProb:
    """Actions sampled from the source's distribution and the source's log-probability of them."""

    actions: np.ndarray
    log_prob: np.ndarray


class Reference(Protocol):
    def outputs(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
    ) -> dict[str, np.ndarray]:
        """Output name (action, logits or mean and log_std, value, next_state) -> the
        source's values; ``action_masks`` (bool [B, n]) for a policy that takes them, and
        ``memory`` for a recurrent one, else None."""
        ...


class Sampler(Protocol):
    """The source's own sampling, for a policy with a distribution."""

    def sampled_log_prob(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
        seed: int,
    ) -> SampledLogProb: ...


@dataclass(frozen=True)
class PolicySource:
    graph: nn.Module  # raw observations in input order -> outputs in output_specs order
    reference: Reference
    algorithm: Algorithm
    provenance: Source
    observation_space: Leaf | Dict  # the raw environment space: what the graph takes
    action_space: Leaf
    distribution: DistributionSpec
    preprocessing: Preprocessing
    sampler: Sampler | None  # None: a deterministic policy (no distribution to hold to)
    action_masks: bool = False  # the graph takes an action mask after the observations
    value: bool = True  # the graph outputs a value (an actor without its critic does not)
    state: StateLayout | None = None  # a recurrent graph's memory: inputs state, episode_start

    def output_specs(self) -> list[TensorSpec]:
        return output_specs(
            self.action_space, self.distribution.kind, value=self.value, state=self.state
        )
