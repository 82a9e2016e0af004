"""CleanRL-style off-policy torch modules: a Q-network (``dqn.py``), a deterministic actor
(``td3_continuous_action.py``, DDPG) or a squashed Gaussian actor (``sac_continuous_action.py``).

The method (``forward`` by default) is called on float32 observations and returns:

- **DQN**: the Q-values ``[B, n]`` of a Discrete action space; the action is their argmax
  and the value their largest;
- **TD3, DDPG**: the action ``[B, d]``, already in the Box's bounds (CleanRL's actors scale
  their tanh output themselves); the graph has no value (the critic is another module);
- **SAC**: ``(mean, log_std)`` of the Gaussian before tanh; the action is ``tanh(mean)``
  rescaled to the Box's bounds (CleanRL's ``action_scale``/``action_bias`` are that
  rescaling), the server samples and scores it as SB3's SAC (``squashed_diag_gaussian``).

The graph and the reference (the same method, eagerly) compute the same formulas, so parity
measures the export itself; the sampler draws from torch's own Normal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from export.actor_critic.heads import Rescale
from export.actor_critic.normalization import NormStats
from export.actor_critic.source import Observations, SampledLogProb
from export.actor_critic.tensors import parameter_width
from export.errors import ExportError
from kernel.contract import Algorithm
from kernel.memory import Memory
from kernel.spaces import Box, Discrete, Leaf, sample

OFF_POLICY = (Algorithm.SAC, Algorithm.TD3, Algorithm.DDPG, Algorithm.DQN)
_PROBE_BATCH = 2


def _outputs(
    module: nn.Module, method: str, algorithm: Algorithm, rescale: Rescale | None, x: Tensor
) -> tuple[Tensor, ...]:
    """action, then the parameters (mean and log_std, or Q-values), then value if any."""
    returned = getattr(module, method)(x)
    if algorithm is Algorithm.DQN:
        return returned.argmax(dim=-1), returned, returned.max(dim=-1).values
    if algorithm is Algorithm.SAC:
        assert rescale is not None
        mean, log_std = returned
        return rescale(torch.tanh(mean)), mean, log_std
    assert rescale is not None
    return (returned.reshape(x.shape[0], *rescale.shape),)


class OffPolicyCore(nn.Module):
    """An ``ActorGraph`` core: the module's method, as :func:`_outputs` reads it."""

    def __init__(
        self, module: nn.Module, method: str, algorithm: Algorithm, action_space: Leaf
    ) -> None:
        super().__init__()
        self.module = module
        self.method = method
        self.algorithm = algorithm
        self.rescale = Rescale(action_space) if isinstance(action_space, Box) else None

    def forward(self, inputs: list[Tensor]) -> tuple[Tensor, ...]:
        return _outputs(self.module, self.method, self.algorithm, self.rescale, inputs[0].float())


@dataclass(frozen=True)
class OffPolicyReference:
    core: OffPolicyCore  # run eagerly, on observations normalised in numpy
    norm: NormStats | None
    output_names: list[str]

    def outputs(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
    ) -> dict[str, np.ndarray]:
        with torch.no_grad():
            values = self.core([self._input(observations)])
        return dict(zip(self.output_names, (v.numpy() for v in values), strict=True))

    def sampled_log_prob(
        self,
        observations: Observations,
        action_masks: np.ndarray | None,
        memory: Memory | None,
        seed: int,
    ) -> SampledLogProb:
        """SAC: tanh of a sample of torch's Normal, and its log-prob with the tanh
        correction (SB3's convention: of the action in [-1, 1]), in float64."""
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            mean, log_std = getattr(self.core.module, self.core.method)(self._input(observations))
            normal = torch.distributions.Normal(mean.double(), log_std.double().exp())
            gaussian = normal.rsample()
        actions = torch.tanh(gaussian)
        correction = torch.log(1 - actions**2 + 1e-6).sum(dim=-1)
        log_prob = normal.log_prob(gaussian).sum(dim=-1) - correction
        return SampledLogProb(actions.numpy(), log_prob.numpy())

    def _input(self, observations: Observations) -> Tensor:
        x = observations[None]
        if self.norm is not None:
            x = self.norm.apply(None, x)
        return torch.as_tensor(x, dtype=torch.float32)


def check(
    module: nn.Module,
    method: str,
    algorithm: Algorithm,
    observation_space: Leaf,
    action_space: Leaf,
    norm: NormStats | None,
) -> None:
    """The action space the algorithm acts in, and one call of the method on a probe batch
    returning what the algorithm's module returns."""
    name = algorithm.value.upper()
    if algorithm is Algorithm.DQN and not isinstance(action_space, Discrete):
        raise ExportError(
            "--algorithm dqn: a Q-network acts in a Discrete action space, not "
            f"{action_space.model_dump_json()[:160]}"
        )
    if algorithm is not Algorithm.DQN and not (
        isinstance(action_space, Box)
        and np.isfinite(action_space.low_array).all()
        and np.isfinite(action_space.high_array).all()
    ):
        raise ExportError(
            f"--algorithm {algorithm.value}: a {name} actor acts in a bounded Box, not "
            f"{action_space.model_dump_json()[:160]}"
        )
    x = sample(observation_space, np.random.default_rng(0), _PROBE_BATCH)
    if norm is not None:
        x = norm.apply(None, x)
    core = OffPolicyCore(module, method, algorithm, action_space)
    try:
        with torch.no_grad():
            outputs = core([torch.as_tensor(x, dtype=torch.float32)])
    except Exception as exc:  # the user's code may raise anything; so may a wrong return
        raise ExportError(
            f"--method {method}: calling it on a batch of {_PROBE_BATCH} observations as a "
            f"{name} module failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
            f"it must return {_RETURNS[algorithm]}"
        ) from None
    wanted = [_PROBE_BATCH, parameter_width(action_space)]
    returned = outputs[0] if len(outputs) == 1 else outputs[1]  # the action; else Q or mean
    got = list(returned.reshape(_PROBE_BATCH, -1).shape)
    if algorithm is Algorithm.SAC and list(outputs[2].shape) != list(outputs[1].shape):
        got = list(outputs[2].shape)
    if got != wanted:
        raise ExportError(
            f"--method {method}: returns {got} for {_PROBE_BATCH} observations, but "
            f"{_RETURNS[algorithm]} of this action space is {wanted}"
        )


_RETURNS: dict[Algorithm, Any] = {
    Algorithm.DQN: "the Q-values [B, n]",
    Algorithm.TD3: "the action [B, d] in the Box's bounds",
    Algorithm.DDPG: "the action [B, d] in the Box's bounds",
    Algorithm.SAC: "(mean, log_std) [B, d] each, before tanh",
}
