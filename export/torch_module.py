"""The CleanRL-style torch source: an nn.Module whose method returns (distribution, value).

``rlserve export torch MODULE_OR_FILE:ATTR``: the module is called on observations as
CleanRL does (``torch.Tensor(obs)``: float32), after the optional NormalizeObservation
statistics; Box actions are clipped to the space's bounds in the graph (CleanRL's
ClipAction wrapper).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from export import module_target, obs_norm, space_args, torch_distributions, torch_probe
from export.action_spaces import checked, distribution_for
from export.files import sha256_of
from export.graph import Parameters, PolicyGraph
from export.heads import deterministic_action
from export.normalization import NormStats
from export.preprocess import observation_pipelines
from export.source import PolicySource
from export.tensors import output_specs
from export.torch_reference import TorchReference
from serve.contract import Algorithm, Normalization, Preprocessing, Source
from serve.distributions import DistributionKind
from serve.errors import ExportError
from serve.spaces import Box, Dict, Leaf

DEFAULT_METHOD = "get_dist_and_value"


@dataclass(frozen=True)
class TorchOptions:
    target: str  # MODULE_OR_FILE:ATTR
    checkpoint: Path | None = None
    env: str | None = None
    observation_space: str | None = None  # JSON
    action_space: str | None = None  # JSON
    method: str = DEFAULT_METHOD
    obs_norm: Path | None = None
    algorithm: Algorithm = Algorithm.PPO


class TorchCore(nn.Module):
    """The module's method on float32 observations, reduced to parameters and value [B]."""

    def __init__(self, module: nn.Module, method: str, kind: DistributionKind) -> None:
        super().__init__()
        self.module = module
        self.method = method
        self.kind = kind

    def forward(self, inputs: list[Tensor]) -> tuple[Parameters, Tensor]:
        with torch_distributions.no_argument_validation():
            distribution, value = getattr(self.module, self.method)(inputs[0].float())
            parameters = torch_distributions.parameters(distribution, self.kind)
        return parameters, value.reshape(value.shape[0])


def load_source(options: TorchOptions) -> PolicySource:
    spaces = space_args.resolve(options.env, options.observation_space, options.action_space)
    observation_space = _observation_space(spaces.observation)
    action_space = checked(spaces.action)
    module = _module(options)
    norm = _norm(options.obs_norm, observation_space)
    torch_probe.check_method(module, options.method, observation_space, action_space, norm)
    kind = distribution_for(action_space).kind
    return PolicySource(
        graph=_graph(TorchCore(module, options.method, kind), norm, action_space),
        reference=TorchReference(
            module=module,
            method=options.method,
            kind=kind,
            norm=norm,
            action_space=action_space,
            output_names=[spec.name for spec in output_specs(action_space, kind)],
        ),
        algorithm=options.algorithm,
        provenance=_provenance(options, module),
        observation_space=observation_space,
        action_space=action_space,
        distribution=distribution_for(action_space),
        preprocessing=Preprocessing(
            normalization=_normalization(norm), action_clip=isinstance(action_space, Box)
        ),
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
    module = module_target.resolve(options.target)
    if options.checkpoint is not None:
        module_target.load_state_dict(module, options.checkpoint)
    if not callable(getattr(module, options.method, None)):
        raise ExportError(
            f"--method {options.method}: {type(module).__name__} has no such method; name the "
            "method that returns (distribution, value) for a batch of observations"
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
