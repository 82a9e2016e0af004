"""Which action spaces an actor-critic export supports, and the distribution each one uses."""

from __future__ import annotations

from export.errors import ExportError
from kernel.contract import DistributionSpec
from kernel.distributions import DistributionKind
from kernel.spaces import Box, Dict, Discrete, Leaf, MultiDiscrete

_SUPPORTED = "Box, Discrete, MultiDiscrete or MultiBinary"


def checked(space: Leaf | Dict) -> Leaf:
    """The action space, refused with a reason when the exported graph could not act in it."""
    if isinstance(space, Dict):
        raise ExportError(f"action_space: Dict action spaces are not supported; use {_SUPPORTED}")
    if isinstance(space, Discrete) and space.start != 0:
        raise ExportError(
            f"action_space: Discrete(n={space.n}, start={space.start}) is not supported; the "
            "policy's actions count from 0, so only start=0 is valid (shift actions in the env)"
        )
    if isinstance(space, MultiDiscrete) and space.start is not None:
        raise ExportError(
            f"action_space: MultiDiscrete with start={list(space.start)} is not supported; "
            "the policy's actions count from 0, so only start=0 is valid"
        )
    return space


def distribution_for(space: Leaf) -> DistributionSpec:
    if isinstance(space, Box):
        return DistributionSpec(kind=DistributionKind.DIAG_GAUSSIAN)
    if isinstance(space, Discrete):
        return DistributionSpec(kind=DistributionKind.CATEGORICAL)
    if isinstance(space, MultiDiscrete):
        return DistributionSpec(kind=DistributionKind.MULTI_CATEGORICAL, nvec=list(space.nvec))
    return DistributionSpec(kind=DistributionKind.BERNOULLI)
