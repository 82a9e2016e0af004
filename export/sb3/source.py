"""The Stable-Baselines3 source: a .zip (+ VecNormalize .pkl) as a PolicySource.

An actor-critic (PPO, A2C) becomes a ``PolicyGraph`` over the policy's own modules
(:mod:`export.sb3.graph`); a recurrent one (RecurrentPPO) a ``RecurrentPolicyGraph`` that
steps its LSTMs (:mod:`export.sb3.recurrent`); an off-policy actor or Q-network (SAC,
TD3, DDPG, DQN) an ``ActorGraph`` (:mod:`export.sb3.off_policy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
from torch import nn

from export.actor_critic.action_spaces import checked, distribution_for
from export.actor_critic.graph import (
    ActorGraph,
    MaskedPolicyGraph,
    PolicyGraph,
    RecurrentPolicyGraph,
)
from export.actor_critic.heads import deterministic_action
from export.actor_critic.normalization import NormStats
from export.actor_critic.preprocess import observation_pipelines
from export.actor_critic.recurrent_core import RecurrentCore
from export.actor_critic.source import PolicySource, Reference, Sampler
from export.actor_critic.tensors import output_specs
from export.errors import ExportError
from export.files import sha256_of
from export.sb3 import checkpoint, vecnormalize
from export.sb3.checkpoint import PolicyFamily
from export.sb3.graph import Sb3Core
from export.sb3.layout import ImageLayout, ObservationLayout, observation_layout
from export.sb3.off_policy import CriticValue, DqnCore, QrDqnCore, SacCore, Td3Core
from export.sb3.off_policy_reference import OffPolicyReference, SacSampler
from export.sb3.recurrent import RecurrentReference, policy_step, state_layout
from export.sb3.reference import Sb3Reference
from kernel.contract import (
    Algorithm,
    DistributionSpec,
    Normalization,
    Preprocessing,
    Source,
    StateLayout,
)
from kernel.distributions import DistributionKind
from kernel.errors import InvalidInput
from kernel.spaces import Box, Discrete, Leaf, MultiDiscrete, from_gymnasium, leaves


@dataclass(frozen=True)
class Sb3Options:
    checkpoint: Path
    vecnormalize: Path | None = None
    no_normalize: bool = False
    algorithm: Algorithm | None = None
    image_layout: ImageLayout = ImageLayout.HWC
    trust_checkpoint: bool = False  # unpickle the checkpoint and statistics as SB3 does


def load_source(options: Sb3Options) -> PolicySource:
    trust = options.trust_checkpoint
    loaded = checkpoint.load(options.checkpoint, options.algorithm, trust_checkpoint=trust)
    _check_normalisation_known(loaded.trained_under_vecnormalize, options)
    normalizer = (
        vecnormalize.load(options.vecnormalize, trust_checkpoint=trust)
        if options.vecnormalize
        else None
    )
    norm = vecnormalize.stats(normalizer) if normalizer is not None else None
    policy = loaded.model.policy
    layout = observation_layout(policy, options.image_layout)
    if norm is not None:
        norm.check_fits(layout.raw_space, f"--vecnormalize {options.vecnormalize}")
    action_space = _action_space(policy.action_space, loaded.family)
    if loaded.family in (PolicyFamily.ACTOR_CRITIC, PolicyFamily.MASKABLE):
        network = _actor_critic(loaded, normalizer, norm, layout, action_space)
    elif loaded.family is PolicyFamily.RECURRENT:
        network = _recurrent(loaded, normalizer, norm, layout, action_space)
    else:
        network = _off_policy(loaded, normalizer, norm, layout, action_space)
    return PolicySource(
        graph=network.graph,
        reference=network.reference,
        sampler=network.sampler,
        action_masks=loaded.family is PolicyFamily.MASKABLE,
        state=network.state,
        algorithm=loaded.algorithm,
        provenance=_provenance(options.checkpoint, policy),
        observation_space=layout.raw_space,
        action_space=action_space,
        distribution=network.distribution,
        preprocessing=Preprocessing(
            normalization=_normalization(norm),
            images=layout.images,
            action_clip=network.action_clip,
        ),
    )


@dataclass(frozen=True)
class _Network:
    """The family-specific part of a source: graph, references, distribution."""

    graph: nn.Module
    reference: Reference
    sampler: Sampler | None
    distribution: DistributionSpec
    action_clip: bool  # the graph clips a Gaussian's mean to the Box's bounds
    state: StateLayout | None = None  # a recurrent network's memory


def _actor_critic(
    loaded: checkpoint.Sb3Checkpoint,
    normalizer: Any | None,
    norm: NormStats | None,
    layout: ObservationLayout,
    action_space: Leaf,
) -> _Network:
    policy, gaussian = loaded.model.policy, isinstance(action_space, Box)
    keys = _keys(layout)
    graph_class = MaskedPolicyGraph if loaded.family is PolicyFamily.MASKABLE else PolicyGraph
    graph = graph_class(
        observation_pipelines(keys, norm, layout.chw_keys),
        Sb3Core(policy, keys, gaussian=gaussian),
        deterministic_action(action_space),
    )
    distribution = distribution_for(action_space)
    reference = Sb3Reference(
        model=loaded.model,
        vecnormalize=normalizer,
        chw_keys=layout.chw_keys,
        output_names=[spec.name for spec in output_specs(action_space, distribution.kind)],
        gaussian=gaussian,
    )
    return _Network(graph, reference, reference, distribution, action_clip=gaussian)


def _recurrent(
    loaded: checkpoint.Sb3Checkpoint,
    normalizer: Any | None,
    norm: NormStats | None,
    layout: ObservationLayout,
    action_space: Leaf,
) -> _Network:
    policy, gaussian = loaded.model.policy, isinstance(action_space, Box)
    keys = _keys(layout)
    try:
        memory = state_layout(policy)
    except ExportError as exc:
        raise ExportError(f"{loaded.path}: {exc.message}") from None
    step = partial(policy_step, keys=keys, gaussian=gaussian)
    graph = RecurrentPolicyGraph(
        observation_pipelines(keys, norm, layout.chw_keys),
        RecurrentCore(policy, step, memory, network_name="policy"),
        deterministic_action(action_space),
    )
    distribution = distribution_for(action_space)
    names = output_specs(action_space, distribution.kind, state=memory)
    reference = RecurrentReference(
        model=loaded.model,
        vecnormalize=normalizer,
        chw_keys=layout.chw_keys,
        output_names=[spec.name for spec in names],
        layout=memory,
        gaussian=gaussian,
    )
    return _Network(graph, reference, reference, distribution, action_clip=gaussian, state=memory)


def _off_policy(
    loaded: checkpoint.Sb3Checkpoint,
    normalizer: Any | None,
    norm: NormStats | None,
    layout: ObservationLayout,
    action_space: Leaf,
) -> _Network:
    policy, family, keys = loaded.model.policy, loaded.family, _keys(layout)
    core: nn.Module
    if family is PolicyFamily.DQN:
        core = DqnCore(policy, keys)
    elif family is PolicyFamily.QRDQN:
        core = QrDqnCore(policy, keys)
    elif family is PolicyFamily.SAC:
        core = SacCore(policy, keys, cast(Box, action_space), CriticValue.SMALLER)
    elif family is PolicyFamily.TQC:
        core = SacCore(policy, keys, cast(Box, action_space), CriticValue.QUANTILE_MEAN)
    else:
        core = Td3Core(policy, keys, cast(Box, action_space))
    sac = family in (PolicyFamily.SAC, PolicyFamily.TQC)
    kind = DistributionKind.SQUASHED_DIAG_GAUSSIAN if sac else DistributionKind.DETERMINISTIC
    reference = OffPolicyReference(
        model=loaded.model,
        family=family,
        vecnormalize=normalizer,
        chw_keys=layout.chw_keys,
        output_names=[spec.name for spec in output_specs(action_space, kind)],
    )
    sampler = SacSampler(loaded.model, normalizer, layout.chw_keys) if sac else None
    graph = ActorGraph(observation_pipelines(keys, norm, layout.chw_keys), core)
    return _Network(graph, reference, sampler, DistributionSpec(kind=kind), action_clip=False)


def _keys(layout: ObservationLayout) -> list[str | None]:
    return [key for key, _ in leaves(layout.raw_space)]


def _check_normalisation_known(trained_under_vecnormalize: bool, options: Sb3Options) -> None:
    if options.vecnormalize is not None and options.no_normalize:
        raise ExportError("--vecnormalize and --no-normalize contradict each other; give one")
    given = options.vecnormalize is not None or options.no_normalize
    if trained_under_vecnormalize and not given:
        raise ExportError(
            f"{options.checkpoint}: the model was trained under VecNormalize, but no "
            "statistics were given; pass --vecnormalize STATS.pkl (saved with "
            "VecNormalize.save()) to bake them in, or --no-normalize if the policy "
            "really takes raw observations"
        )


def _action_space(gym_space: Any, family: PolicyFamily) -> Leaf:
    try:
        space = checked(from_gymnasium(gym_space))
    except InvalidInput as exc:
        raise ExportError(f"action_space: {exc.message}") from None
    if family is PolicyFamily.MASKABLE and not isinstance(space, Discrete | MultiDiscrete):
        raise ExportError(
            "action_space: rlserve serves action masks for Discrete and MultiDiscrete action "
            f"spaces; this MaskablePPO policy acts in {space.model_dump_json()[:160]}"
        )
    continuous = family in (PolicyFamily.SAC, PolicyFamily.TD3, PolicyFamily.TQC)
    if continuous and not (isinstance(space, Box) and _bounded(space)):
        raise ExportError(
            f"action_space: a {family.value} policy acts in a bounded Box (its tanh output "
            f"is rescaled to the bounds); this one is {space.model_dump_json()[:160]}"
        )
    return space


def _bounded(space: Box) -> bool:
    return bool(np.isfinite(space.low_array).all() and np.isfinite(space.high_array).all())


def _provenance(path: Path, policy: Any) -> Source:
    import stable_baselines3

    cls = type(policy)
    return Source(
        framework="stable-baselines3",
        framework_version=stable_baselines3.__version__,
        checkpoint=path.name,
        sha256=sha256_of(path),
        policy_class=f"{cls.__module__}.{cls.__qualname__}",
    )


def _normalization(norm: NormStats | None) -> Normalization | None:
    if norm is None:
        return None
    return Normalization(keys=list(norm.leaves), clip=norm.clip, epsilon=norm.epsilon)
