"""The Stable-Baselines3 source: a PPO or A2C .zip (+ VecNormalize .pkl) as a PolicySource."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.actor_critic.action_spaces import checked, distribution_for
from export.actor_critic.graph import PolicyGraph
from export.actor_critic.heads import deterministic_action
from export.actor_critic.normalization import NormStats
from export.actor_critic.preprocess import observation_pipelines
from export.actor_critic.source import PolicySource
from export.actor_critic.tensors import output_specs
from export.files import sha256_of
from export.sb3 import checkpoint, vecnormalize
from export.sb3.graph import Sb3Core
from export.sb3.layout import ImageLayout, ObservationLayout, observation_layout
from export.sb3.reference import Sb3Reference
from serve.contract import Algorithm, Normalization, Preprocessing, Source
from serve.errors import ExportError, InvalidInput
from serve.spaces import Box, Leaf, from_gymnasium, leaves


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
    action_space = _action_space(policy.action_space)
    return PolicySource(
        graph=_graph(policy, layout, norm, action_space),
        reference=_reference(loaded.model, normalizer, layout, action_space),
        algorithm=loaded.algorithm,
        provenance=_provenance(options.checkpoint, policy),
        observation_space=layout.raw_space,
        action_space=action_space,
        distribution=distribution_for(action_space),
        preprocessing=Preprocessing(
            normalization=_normalization(norm),
            images=layout.images,
            action_clip=isinstance(action_space, Box),
        ),
    )


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


def _action_space(gym_space: Any) -> Leaf:
    try:
        return checked(from_gymnasium(gym_space))
    except InvalidInput as exc:
        raise ExportError(f"action_space: {exc.message}") from None


def _graph(
    policy: Any, layout: ObservationLayout, norm: NormStats | None, action_space: Leaf
) -> PolicyGraph:
    keys = [key for key, _ in leaves(layout.raw_space)]
    return PolicyGraph(
        observation_pipelines(keys, norm, layout.chw_keys),
        Sb3Core(policy, keys, gaussian=isinstance(action_space, Box)),
        deterministic_action(action_space),
    )


def _reference(
    model: Any, normalizer: Any | None, layout: ObservationLayout, action_space: Leaf
) -> Sb3Reference:
    kind = distribution_for(action_space).kind
    return Sb3Reference(
        model=model,
        vecnormalize=normalizer,
        chw_keys=layout.chw_keys,
        output_names=[spec.name for spec in output_specs(action_space, kind)],
        gaussian=isinstance(action_space, Box),
    )


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
