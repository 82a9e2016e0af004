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
from dataclasses import dataclass

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
        first = requests[0].options
        alike = first.seed is None and all(
            r.options is first and r.evaluate is None for r in requests
        )
        if alike and not needs_distribution(first):
            return outputs  # the graph's actions are the answer
        self._stochastic(outputs, requests, uniform=alike)
        return outputs

    def _stochastic(self, outputs: Outputs, requests: Sequence[Prepared], *, uniform: bool) -> None:
        """Sampled actions and log-probs for every row. A batch whose requests share one
        options object (no seed: ``predict_options`` gives equal parameters one object) is
        done in whole-batch operations; otherwise rows are sorted out request by request."""
        params = {role: outputs[role] for role in self.parameters}
        dist = distributions.build(self._kind, params, self._nvec)
        taken = dist.mode().astype(np.float64)
        rows = len(taken)
        sampled = np.full(rows, uniform and not requests[0].options.deterministic)
        seeded: list[_Seeded] = []
        if not uniform:
            start = 0
            for request in requests:
                stop = start + request.rows
                options = request.options
                if request.evaluate is not None and needs_distribution(options):
                    taken[start:stop] = request.evaluate.reshape(taken[start:stop].shape)
                elif not options.deterministic:
                    sampled[start:stop] = True
                    if options.seed is not None:
                        seeded.append(_Seeded.of(request, start, stop, options.seed))
                start = stop
        if sampled.any():
            self._sample(dist, sampled, seeded, taken, outputs)
        outputs["log_probs"] = dist.log_prob(taken)

    def _sample(
        self,
        dist: distributions.Distribution,
        sampled: np.ndarray,
        seeded: list[_Seeded],
        taken: np.ndarray,
        outputs: Outputs,
    ) -> None:
        """Sample the rows marked in ``sampled``: one draw for all of them, then each seeded
        request's rows replaced by its own generator's draw."""
        indices = None if sampled.all() else np.flatnonzero(sampled)
        rows: slice | np.ndarray = slice(None) if indices is None else indices
        subset = dist if indices is None else dist.take(indices)
        noise = subset.draw(self._rng, int(np.count_nonzero(sampled)))
        for one in seeded:
            at = int(np.count_nonzero(sampled[: one.start]))  # its rows among the sampled
            rows_drawn = dist.draw(_seeded(one.seed), one.total)  # the whole request's draw
            noise[at : at + one.stop - one.start] = rows_drawn[
                one.offset : one.offset + one.stop - one.start
            ]
        actions = subset.sample_with(noise)
        taken[rows] = actions
        env_actions = outputs["actions"].copy()
        env_actions[rows] = self._to_env(actions)
        outputs["actions"] = env_actions

    def _to_env(self, sampled: np.ndarray) -> np.ndarray:
        """Sampled actions as the environment takes them: in the action space's shape,
        clipped to a Box's bounds when the contract clips."""
        shaped = sampled.reshape(len(sampled), *self._action_shape)
        if self._clip is None:
            return shaped
        low, high = self._clip
        return np.clip(shaped, low, high).astype(np.float32)


@dataclass(frozen=True, slots=True)
class _Seeded:
    """A seeded request's rows in the batch, and where they sit in the whole request (a
    request split across batches draws as if it ran whole)."""

    start: int
    stop: int
    seed: int
    offset: int
    total: int

    @classmethod
    def of(cls, request: Prepared, start: int, stop: int, seed: int) -> _Seeded:
        part = request.part
        if part is None:
            return cls(start, stop, seed, 0, stop - start)
        return cls(start, stop, seed, part.offset, part.total)


def _seeded(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
