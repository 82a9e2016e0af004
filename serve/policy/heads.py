"""The policy heads of an actor-critic: what a batch's graph outputs become, for all its rows.

The graph gives, per row, the deterministic action, the distribution's parameters and the
value. :class:`PolicyHeads` adds what needs randomness or a given action, vectorised over
the whole batch:

- ``actions``: the graph's action, or for rows of stochastic requests an action sampled
  from the distribution (clipped to a Box's bounds when the contract says so; a squashed
  Gaussian's, in [-1, 1], rescaled to them);
- ``log_probs``: the log-probability of the action each row took (sampled, deterministic,
  or given by the request to be scored), when any request of the batch needs them.

Randomness comes in one draw per batch for requests without a seed. A request with a seed
draws from its own generator, exactly what ``Distribution.sample(np.random.default_rng(
seed))`` draws for its rows alone, so a seed gives the same actions whatever shares the
batch. Outputs are named by role: ``actions``, ``values``, ``q_values``, ``log_probs``, and
the distribution's parameters ``logits`` or ``mean`` and ``log_std``. A deterministic
policy (TD3, DDPG, DQN) has no distribution: its requests never need one (the policy
refuses those that would).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kernel import distributions
from kernel.contract import PolicyContract, TensorRole
from kernel.distributions import DistributionKind
from kernel.spaces import Box, leaf_shape
from serve.dataplane.messages import Prepared
from serve.types import OutputKind, Outputs, PredictOptions

PARAMETER_ROLES = (TensorRole.LOGITS, TensorRole.MEAN, TensorRole.LOG_STD)


def _alike(requests: Sequence[Prepared]) -> bool:
    """The batch's requests share one options object, without a seed or actions to score."""
    first = requests[0].options
    return first.seed is None and all(r.options is first and r.evaluate is None for r in requests)


def _sampled(requests: Sequence[Prepared], *, alike: bool) -> bool:
    """Whether a batch of a stochastic policy needs its distribution: unless its requests
    are ``alike`` and want neither sampled actions nor log-probs."""
    return not alike or needs_distribution(requests[0].options)


def action_outputs(contract: PolicyContract) -> tuple[str, ...]:
    """The graph outputs a batch that wants only deterministic actions needs: the action,
    and a recurrent policy's next memory."""
    roles = (TensorRole.ACTION, TensorRole.NEXT_STATE)
    return tuple(o.name for role in roles for o in contract.outputs if o.role == role)


def needs_distribution(options: PredictOptions) -> bool:
    """Whether a request's rows need the distribution: to sample, or for log-probs."""
    return not options.deterministic or OutputKind.LOG_PROBS in options.outputs


class PolicyHeads:
    def __init__(self, contract: PolicyContract) -> None:
        names = {o.role: o.name for o in contract.outputs}
        self._action = names[TensorRole.ACTION]
        self._value = names.get(TensorRole.VALUE)
        self._q_values = names.get(TensorRole.Q_VALUES)
        self._next_state = names.get(TensorRole.NEXT_STATE)
        self.has_q_values = self._q_values is not None
        self.parameters = {role.value: names[role] for role in PARAMETER_ROLES if role in names}
        self._kind = contract.distribution.kind
        self.stochastic = self._kind.stochastic
        self._nvec = tuple(contract.distribution.nvec or ()) or None
        space = contract.action_space
        self._action_shape = leaf_shape(space)  # type: ignore[arg-type]
        self._bounds = (space.low_array, space.high_array) if isinstance(space, Box) else None
        self._squashed = self._kind is DistributionKind.SQUASHED_DIAG_GAUSSIAN
        self._clip = self._bounds is not None and contract.preprocessing.action_clip
        self._rng = np.random.default_rng()  # used by one batch at a time
        self.action_outputs = action_outputs(contract)
        carried = {"values": self._value, "q_values": self._q_values, **self.parameters}
        carried["state"] = self._next_state
        self._carried = tuple((role, name) for role, name in carried.items() if name is not None)
        # the graph outputs passed on as they are, by role

    def __call__(self, graph: Outputs, requests: Sequence[Prepared]) -> Outputs:
        """The batch's outputs by role. ``graph`` holds every output of the graph, or, for a
        batch ``answered_by_graph``, at least ``action_outputs``."""
        outputs = {"actions": graph[self._action]}
        for role, name in self._carried:
            if name in graph:
                outputs[role] = graph[name]
        if not self.stochastic:
            return outputs  # the policy refused every request that needed a distribution
        alike = _alike(requests)
        if not _sampled(requests, alike=alike):
            return outputs
        self._stochastic(outputs, requests, uniform=alike)
        return outputs

    def distribution(self, outputs: Outputs) -> distributions.Distribution:
        """The batch's action distribution, from its parameters among ``outputs`` (the
        graph's whole outputs: a stochastic policy's)."""
        params = {role: outputs[role] for role in self.parameters}
        return distributions.build(self._kind, params, self._nvec)

    def answered_by_graph(self, requests: Sequence[Prepared]) -> bool:
        """Whether the batch's actions are the graph's own: nothing sampled, no log-prob
        (always, for a deterministic policy: it refused every request that needed them)."""
        return not self.stochastic or not _sampled(requests, alike=_alike(requests))

    def _stochastic(self, outputs: Outputs, requests: Sequence[Prepared], *, uniform: bool) -> None:
        """Sampled actions and log-probs for every row. A batch whose requests share one
        options object (no seed: ``predict_options`` gives equal parameters one object) is
        done in whole-batch operations; otherwise rows are sorted out request by request."""
        dist = self.distribution(outputs)
        if uniform and not requests[0].options.deterministic:  # every row sampled, one draw
            actions = dist.sample_with(dist.draw(self._rng, len(outputs["actions"])))
            graph_actions = outputs["actions"]
            outputs["actions"] = self._to_env(actions).astype(graph_actions.dtype, copy=False)
            outputs["log_probs"] = dist.log_prob(actions.astype(np.float64))
            return
        taken = dist.mode().astype(np.float64)
        rows = len(taken)
        sampled = np.zeros(rows, bool)  # a uniform batch here samples nothing (else: above)
        seeded: list[_Seeded] = []
        if not uniform:
            start = 0
            for request in requests:
                stop = start + request.rows
                options = request.options
                if request.evaluate is not None and needs_distribution(options):
                    given = self._from_env(request.evaluate)
                    taken[start:stop] = given.reshape(taken[start:stop].shape)
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
        """Sampled actions as the environment takes them: in the action space's shape;
        squashed ones ([-1, 1]) rescaled to a Box's bounds, others clipped to them when the
        contract clips."""
        shaped = sampled.reshape(len(sampled), *self._action_shape)
        if self._bounds is None or not (self._squashed or self._clip):
            return shaped
        low, high = self._bounds
        if self._squashed:
            rescaled = low + 0.5 * (shaped.astype(np.float64) + 1.0) * (high - low)
            return rescaled.astype(np.float32)
        return np.clip(shaped, low, high).astype(np.float32)

    def _from_env(self, given: np.ndarray) -> np.ndarray:
        """Actions given in the environment's space, where the distribution scores them:
        a squashed policy's into [-1, 1]."""
        if self._bounds is None or not self._squashed:
            return given
        low, high = self._bounds
        flat = given.reshape(len(given), -1).astype(np.float64)
        scaled: np.ndarray = 2.0 * (flat - low.reshape(-1)) / (high - low).reshape(-1) - 1.0
        return scaled


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
