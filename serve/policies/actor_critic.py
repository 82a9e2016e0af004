"""Actor-critic policies (PPO, A2C): request validation, batched execution, answers.

The graph gives the deterministic action, the distribution parameters and the value for
every row. Stochastic actions and log-probabilities are computed here from those
parameters with ``serve.distributions``, per request: a request's ``seed`` reproduces its
actions whatever else shares its batch, and its log-probs come from the same graph run
as its actions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from serve import distributions
from serve.contract import PolicyContract, TensorRole
from serve.dataplane.runtime import Session
from serve.errors import InvalidInput, RLServeError
from serve.spaces import Box, parse_observations
from serve.types import Answer, OutputKind, Outputs, PredictOptions, Prepared

_FIELDS = ("observations", "actions", "deterministic", "seed", "outputs")


class ActorCriticPolicy:
    def __init__(
        self,
        name: str,
        version: int,
        contract: PolicyContract,
        session: Session,
        sha256: str,
        max_batch_size: int,
    ) -> None:
        self.name, self.version, self.contract, self.sha256 = name, version, contract, sha256
        self.provider_report = session.report
        self.provider = session.report.primary
        self._session = session
        self._max_rows = max_batch_size
        self._rng = np.random.default_rng()  # only used by the batch thread
        self._names = {o.role: o.name for o in contract.outputs}
        self._params = [o for o in contract.outputs if o.role in _PARAM_ROLES]

    # ------------------------------------------------------------------ request path

    def prepare(self, payload: Mapping[str, Any]) -> Prepared:
        unknown = sorted(set(payload) - set(_FIELDS))
        if unknown:
            raise InvalidInput(f"unknown field(s) {unknown}; a request may have {list(_FIELDS)}")
        if "observations" not in payload:
            raise InvalidInput("observations: required (one observation or a list of them)")
        batch = parse_observations(self.contract.observation_space, payload["observations"])
        if batch.rows > self._max_rows:
            raise InvalidInput(
                f"observations: {batch.rows} rows exceed max_batch_size {self._max_rows} of "
                f"model {self.name!r}; send at most {self._max_rows} per request, or raise "
                "max_batch_size in the model's config.yaml"
            )
        feeds = {spec.name: batch.arrays[spec.key] for spec in self.contract.inputs}
        evaluate = self._given_actions(payload, batch.rows, batch.single)
        return Prepared(feeds, batch.rows, batch.single, _options(payload), evaluate)

    def _given_actions(
        self, payload: Mapping[str, Any], rows: int, single: bool
    ) -> np.ndarray | None:
        """Actions to score (log-probs of what the caller took), validated like observations."""
        if "actions" not in payload:
            return None
        given = parse_observations(self.contract.action_space, payload["actions"], field="actions")
        if (given.rows, given.single) != (rows, single):
            raise InvalidInput(
                f"actions: give one action per observation; got {given.rows} "
                f"for {rows} observation{'s' if rows != 1 else ''}"
            )
        return given.arrays[None]

    def execute(self, batch: Sequence[Prepared], padded_rows: int) -> Outputs:
        return self._session.run(_stack(batch, padded_rows))

    def answer(self, batch: Sequence[Prepared], outputs: Outputs) -> list[Answer | RLServeError]:
        answers: list[Answer | RLServeError] = []
        start = 0
        for item in batch:
            rows = {k: v[start : start + item.rows] for k, v in outputs.items()}
            answers.append(self._answer(rows, item))
            start += item.rows
        return answers

    def warm_up(self, sizes: Sequence[int]) -> None:
        golden = self.contract.observation_feeds(self.contract.golden[0].observations)
        for size in sizes:
            self._session.run({k: _fill(v, size) for k, v in golden.items()})

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "kind": self.contract.kind,
            "sha256": self.sha256,
            "provider": self.provider,
            "contract": self.contract.model_dump(mode="json", by_alias=True),
        }

    # ------------------------------------------------------------------ answers

    def _answer(self, rows: dict[str, np.ndarray], item: Prepared) -> Answer:
        options = item.options
        wanted = options.outputs
        needs_dist = not options.deterministic or OutputKind.LOG_PROBS in wanted
        answer: Answer = {}
        if needs_dist:
            dist = self._distribution(rows)
            if item.evaluate is not None:
                taken = actions = item.evaluate
            elif options.deterministic:
                taken = dist.mode()
                actions = rows[self._names[TensorRole.ACTION]]
            else:
                rng = np.random.default_rng(options.seed) if options.seed is not None else self._rng
                taken = dist.sample(rng)
                actions = self._to_env(taken)
            if OutputKind.LOG_PROBS in wanted:
                answer["log_probs"] = dist.log_prob(taken)
        else:
            actions = rows[self._names[TensorRole.ACTION]]
        if OutputKind.ACTIONS in wanted:
            answer["actions"] = actions
        if OutputKind.VALUES in wanted and TensorRole.VALUE in self._names:
            answer["values"] = rows[self._names[TensorRole.VALUE]]
        if OutputKind.DISTRIBUTION in wanted:
            answer["distribution"] = {o.role.value: rows[o.name] for o in self._params}
        return _unbatch(answer) if item.single else answer

    def _distribution(self, rows: dict[str, np.ndarray]) -> distributions.Distribution:
        return distributions.build(
            self.contract.distribution.kind,
            {o.role.value: rows[o.name] for o in self._params},
            tuple(self.contract.distribution.nvec or ()) or None,
        )

    def _to_env(self, sampled: np.ndarray) -> np.ndarray:
        """A sampled action as the environment takes it: clipped to a Box's bounds."""
        space = self.contract.action_space
        if isinstance(space, Box) and self.contract.preprocessing.action_clip:
            return np.clip(sampled, space.low_array, space.high_array).astype(np.float32)
        return sampled


_PARAM_ROLES = (TensorRole.LOGITS, TensorRole.MEAN, TensorRole.LOG_STD)


def _options(payload: Mapping[str, Any]) -> PredictOptions:
    deterministic = payload.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise InvalidInput(f"deterministic: expected true or false, got {deterministic!r}")
    seed = payload.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise InvalidInput(f"seed: expected a non-negative integer, got {seed!r}")
    outputs = payload.get("outputs", [OutputKind.ACTIONS.value])
    valid = [k.value for k in OutputKind]
    if not isinstance(outputs, list) or not outputs or any(o not in valid for o in outputs):
        raise InvalidInput(
            f"outputs: expected a non-empty list drawn from {valid}, got {outputs!r}"
        )
    return PredictOptions(deterministic, seed, frozenset(OutputKind(o) for o in outputs))


def _stack(batch: Sequence[Prepared], padded_rows: int) -> dict[str, np.ndarray]:
    names = batch[0].feeds.keys()
    stacked = {n: np.concatenate([p.feeds[n] for p in batch]) for n in names}
    return {n: _fill(a, padded_rows) for n, a in stacked.items()}


def _fill(array: np.ndarray, rows: int) -> np.ndarray:
    """The first ``rows`` rows, padded by repeating the last row where there are fewer."""
    if len(array) == rows:
        return array
    return array[np.minimum(np.arange(rows), len(array) - 1)]


def _unbatch(answer: Answer) -> Answer:
    return {k: (_unbatch(v) if isinstance(v, dict) else v[0]) for k, v in answer.items()}
