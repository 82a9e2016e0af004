"""The policy heads of an actor-critic: what a batch's graph outputs become, for all its rows.

The graph gives, per row, the deterministic action, the distribution's parameters and the
value. :class:`PolicyHeads` adds what needs randomness or a given action, vectorised over
the whole batch:

- ``actions``: the graph's action, or for rows of stochastic requests an action sampled
  from the distribution (clipped to a Box's bounds when the contract says so);
- ``log_probs``: the log-probability of the action each row took (sampled, deterministic,
  or given by the request to be scored), when any request of the batch needs them.

Randomness comes in one draw per batch for requests without a seed. A request with a seed
draws from its own generator, exactly what ``Distribution.sample(np.random.default_rng(
seed))`` draws for its rows alone, so a seed gives the same actions whatever shares the
batch. Outputs are named by role: ``actions``, ``values``, ``log_probs``, and the
distribution's parameters ``logits`` or ``mean`` and ``log_std``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serve import distributions
from serve.contract import PolicyContract, TensorRole
from serve.dataplane.messages import Prepared
from serve.spaces import Box, leaf_shape
from serve.types import OutputKind, Outputs, PredictOptions

PARAMETER_ROLES = (TensorRole.LOGITS, TensorRole.MEAN, TensorRole.LOG_STD)


def needs_distribution(options: PredictOptions) -> bool:
    """Whether a request's rows need the distribution: to sample, or for log-probs."""
    return not options.deterministic or OutputKind.LOG_PROBS in options.outputs


class PolicyHeads:
    def __init__(self, contract: PolicyContract) -> None:
        names = {o.role: o.name for o in contract.outputs}
        self._action = names[TensorRole.ACTION]
        self._value = names.get(TensorRole.VALUE)
        self.parameters = {role.value: names[role] for role in PARAMETER_ROLES if role in names}
        self._kind = contract.distribution.kind
        self._nvec = tuple(contract.distribution.nvec or ()) or None
        space = contract.action_space
        self._action_shape = leaf_shape(space)  # type: ignore[arg-type]
        clip = isinstance(space, Box) and contract.preprocessing.action_clip
        self._clip = (
            (space.low_array, space.high_array) if isinstance(space, Box) and clip else None
        )
        self._rng = np.random.default_rng()  # used by one batch at a time

    def __call__(self, graph: Outputs, requests: Sequence[Prepared]) -> Outputs:
        outputs = {"actions": graph[self._action]}
        if self._value is not None:
            outputs["values"] = graph[self._value]
        for role, name in self.parameters.items():
            outputs[role] = graph[name]
        if any(needs_distribution(r.options) for r in requests):
            self._stochastic(outputs, requests)
        return outputs

    def _stochastic(self, outputs: Outputs, requests: Sequence[Prepared]) -> None:
        params = {role: outputs[role] for role in self.parameters}
        dist = distributions.build(self._kind, params, self._nvec)
        taken = dist.mode().astype(np.float64)
        sampled_rows: list[np.ndarray] = []
        noise: list[np.ndarray | int] = []  # per stochastic request: its draw, or its row count
        start = 0
        for request in requests:
            stop = start + request.rows
            options = request.options
            if request.evaluate is not None and needs_distribution(options):
                taken[start:stop] = request.evaluate.reshape(taken[start:stop].shape)
            elif not options.deterministic:
                sampled_rows.append(np.arange(start, stop))
                seed = options.seed
                noise.append(
                    request.rows if seed is None else dist.draw(_seeded(seed), request.rows)
                )
            start = stop
        if sampled_rows:
            rows = np.concatenate(sampled_rows)
            sampled = dist.take(rows).sample_with(self._noise(dist, noise))
            taken[rows] = sampled
            actions = outputs["actions"].copy()
            actions[rows] = self._to_env(sampled)
            outputs["actions"] = actions
        outputs["log_probs"] = dist.log_prob(taken)

    def _noise(self, dist: distributions.Distribution, parts: list[np.ndarray | int]) -> np.ndarray:
        """The draws of every sampled row in order; unseeded rows share one draw."""
        unseeded = sum(p for p in parts if isinstance(p, int))
        shared = dist.draw(self._rng, unseeded) if unseeded else None
        pieces, used = [], 0
        for part in parts:
            if isinstance(part, int):
                assert shared is not None
                pieces.append(shared[used : used + part])
                used += part
            else:
                pieces.append(part)
        return np.concatenate(pieces)

    def _to_env(self, sampled: np.ndarray) -> np.ndarray:
        """Sampled actions as the environment takes them: in the action space's shape,
        clipped to a Box's bounds when the contract clips."""
        shaped = sampled.reshape(len(sampled), *self._action_shape)
        if self._clip is None:
            return shaped
        low, high = self._clip
        return np.clip(shaped, low, high).astype(np.float32)


def _seeded(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
