"""The CleanRL-style torch source: an nn.Module whose method returns (distribution, value).

``rlserve export torch MODULE_OR_FILE:ATTR``: the module is called on observations as
CleanRL does (``torch.Tensor(obs)``: float32), after the optional NormalizeObservation
statistics; Box actions are clipped to the space's bounds in the graph (CleanRL's
ClipAction wrapper).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from export.actor_critic.action_spaces import checked, distribution_for
from export.actor_critic.graph import ActorGraph, Parameters, PolicyGraph, RecurrentPolicyGraph
from export.actor_critic.heads import deterministic_action
from export.actor_critic.normalization import NormStats
from export.actor_critic.preprocess import observation_pipelines
from export.actor_critic.recurrent_core import RecurrentCore
from export.actor_critic.source import PolicySource
from export.actor_critic.tensors import output_specs
from export.errors import ExportError
from export.files import sha256_of
from export.modules import (
    distributions,
    obs_norm,
    off_policy,
    probe,
    recurrent,
    spaces,
    target,
)
from export.modules.reference import TorchReference
from kernel.contract import Algorithm, DistributionSpec, Normalization, Preprocessing, Source
from kernel.distributions import DistributionKind
from kernel.spaces import Box, Dict, Leaf

DEFAULT_METHOD = "get_dist_and_value"


@dataclass(frozen=True)
class TorchOptions:
    target: str  # MODULE_OR_FILE:ATTR
    checkpoint: Path | None = None
    env: str | None = None
    observation_space: str | None = None  # JSON
    action_space: str | None = None  # JSON
    method: str | None = None  # None: DEFAULT_METHOD, or forward for off-policy modules
    obs_norm: Path | None = None
    algorithm: Algorithm = Algorithm.PPO
    lstm: str | None = None  # the module's nn.LSTM attribute: a recurrent policy

    @property
    def method_name(self) -> str:
        if self.method is not None:
            return self.method
        return "forward" if self.algorithm in off_policy.OFF_POLICY else DEFAULT_METHOD


class TorchCore(nn.Module):
    """The module's method on float32 observations, reduced to parameters and value [B]."""

    def __init__(self, module: nn.Module, method: str, kind: DistributionKind) -> None:
        super().__init__()
        self.module = module
        self.method = method
        self.kind = kind

    def forward(self, inputs: list[Tensor]) -> tuple[Parameters, Tensor]:
        with distributions.no_argument_validation():
            distribution, value = getattr(self.module, self.method)(inputs[0].float())
            parameters = distributions.parameters(distribution, self.kind)
        return parameters, value.reshape(value.shape[0])


def load_source(options: TorchOptions) -> PolicySource:
    resolved = spaces.resolve(options.env, options.observation_space, options.action_space)
    observation_space = _observation_space(resolved.observation)
    action_space = checked(resolved.action)
    module = _module(options)
    norm = _norm(options.obs_norm, observation_space)
    if options.algorithm in off_policy.OFF_POLICY:
        return _off_policy(options, module, norm, observation_space, action_space)
    if options.lstm is not None:
        return _recurrent(options, options.lstm, module, norm, observation_space, action_space)
    probe.check_method(module, options.method_name, observation_space, action_space, norm)
    kind = distribution_for(action_space).kind
    reference = TorchReference(
        module=module,
        method=options.method_name,
        kind=kind,
        norm=norm,
        action_space=action_space,
        output_names=[spec.name for spec in output_specs(action_space, kind)],
    )
    return PolicySource(
        graph=_graph(TorchCore(module, options.method_name, kind), norm, action_space),
        reference=reference,
        sampler=reference,
        algorithm=options.algorithm,
        provenance=_provenance(options, module),
        observation_space=observation_space,
        action_space=action_space,
        distribution=distribution_for(action_space),
        preprocessing=Preprocessing(
            normalization=_normalization(norm), action_clip=isinstance(action_space, Box)
        ),
    )


def _off_policy(
    options: TorchOptions,
    module: nn.Module,
    norm: NormStats | None,
    observation_space: Leaf,
    action_space: Leaf,
) -> PolicySource:
    algorithm, method = options.algorithm, options.method_name
    off_policy.check(module, method, algorithm, observation_space, action_space, norm)
    sac = algorithm is Algorithm.SAC
    kind = DistributionKind.SQUASHED_DIAG_GAUSSIAN if sac else DistributionKind.DETERMINISTIC
    value = algorithm is Algorithm.DQN  # an actor comes without its critic
    core = off_policy.OffPolicyCore(module, method, algorithm, action_space)
    names = [spec.name for spec in output_specs(action_space, kind, value=value)]
    reference = off_policy.OffPolicyReference(core, norm, names)
    pipelines = observation_pipelines([None], norm, chw_keys=set())
    return PolicySource(
        graph=ActorGraph(pipelines, core),
        reference=reference,
        sampler=reference if sac else None,
        value=value,
        algorithm=algorithm,
        provenance=_provenance(options, module),
        observation_space=observation_space,
        action_space=action_space,
        distribution=DistributionSpec(kind=kind),
        preprocessing=Preprocessing(normalization=_normalization(norm), action_clip=False),
    )


def _recurrent(
    options: TorchOptions,
    attr: str,
    module: nn.Module,
    norm: NormStats | None,
    observation_space: Leaf,
    action_space: Leaf,
) -> PolicySource:
    if options.algorithm not in (Algorithm.PPO, Algorithm.A2C):
        raise ExportError(
            f"--lstm {attr}: recurrent modules are exported as actor-critics (--algorithm "
            f"ppo or a2c), not {options.algorithm.value}"
        )
    layout = recurrent.state_layout(recurrent.the_lstm(module, attr), attr)
    batch = torch.as_tensor(probe.sample_batch(observation_space, norm))
    recurrent.check_method(module, options.method_name, layout, batch)
    kind = distribution_for(action_space).kind
    reference = recurrent.TorchRecurrentReference(
        module=module,
        method=options.method_name,
        kind=kind,
        norm=norm,
        action_space=action_space,
        layout=layout,
        output_names=[spec.name for spec in output_specs(action_space, kind, state=layout)],
    )
    step = partial(recurrent.method_step, method=options.method_name, kind=kind)
    core = RecurrentCore(recurrent.stepped(module, attr), step, layout, network_name="module")
    pipelines = observation_pipelines([None], norm, chw_keys=set())
    return PolicySource(
        graph=RecurrentPolicyGraph(pipelines, core, deterministic_action(action_space)),
        reference=reference,
        sampler=reference,
        algorithm=options.algorithm,
        provenance=_provenance(options, module),
        observation_space=observation_space,
        action_space=action_space,
        distribution=distribution_for(action_space),
        preprocessing=Preprocessing(
            normalization=_normalization(norm), action_clip=isinstance(action_space, Box)
        ),
        state=layout,
    )


def _graph(core: TorchCore, norm: NormStats | None, action_space: Leaf) -> PolicyGraph:
    pipelines = observation_pipelines([None], norm, chw_keys=set())
    return PolicyGraph(pipelines, core, deterministic_action(action_space))


def _norm(path: Path | None, observation_space: Leaf) -> NormStats | None:
    if path is None:
        return None
    norm = obs_norm.load(path)
    norm.check_fits(observation_space, f"--obs-norm {path}")
    return norm


def _observation_space(space: Leaf | Dict) -> Leaf:
    if isinstance(space, Dict):
        raise ExportError(
            "observation space: Dict observations are not supported for torch modules "
            "(the method takes one tensor); flatten the observation, or export with SB3's "
            "MultiInputPolicy"
        )
    return space


def _module(options: TorchOptions) -> nn.Module:
    module = target.resolve(options.target)
    if options.checkpoint is not None:
        target.load_state_dict(module, options.checkpoint)
    if not callable(getattr(module, options.method_name, None)):
        returns = (
            "its off-policy output (Q-values, an action, or mean and log_std)"
            if options.algorithm in off_policy.OFF_POLICY
            else "(distribution, value)"
        )
        raise ExportError(
            f"--method {options.method_name}: {type(module).__name__} has no such method; "
            f"name the method that returns {returns} for a batch of observations"
        )
    return module.eval()


def _provenance(options: TorchOptions, module: nn.Module) -> Source:
    cls = type(module)
    checkpoint = options.checkpoint
    return Source(
        framework="torch",
        framework_version=torch.__version__,
        checkpoint=checkpoint.name if checkpoint is not None else options.target,
        sha256=sha256_of(checkpoint) if checkpoint is not None else _state_sha256(module),
        policy_class=f"{cls.__module__}.{cls.__qualname__}",
    )


def _state_sha256(module: nn.Module) -> str:
    """A checksum of the weights themselves, when they came with the module, not a file."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _normalization(norm: NormStats | None) -> Normalization | None:
    if norm is None:
        return None
    return Normalization(keys=[None], clip=norm.clip, epsilon=norm.epsilon)
