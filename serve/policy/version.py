"""The served version of a policy from observations to actions (actor-critics: PPO, A2C,
MaskablePPO, RecurrentPPO; off-policy actors and Q-networks: SAC, TD3, DDPG, DQN):
validation, batched execution, answers. A masked policy's masks and a recurrent policy's
memory (given, or held by the server for a sequence) are checked with the observations.

Built once per loaded version: the contract's compiled observation validator
(``serve.policy.validation``) checks requests on the event loop; a batch runs the
graph once and the policy heads (``serve.policy.heads``) once over all its rows; each
request's answer is then a slice of those outputs.

On the CPU a version also keeps its graph cut to the deterministic action
(:func:`action_session`, ``serve.execution.graph_cut``): a batch that wants only the
graph's actions runs it, leaving out the critic and the distribution's parameters, whose
weights a small policy's run at batch 1 would spend most of its time reading. The cut is
served only once its outputs equal the whole graph's, bit for bit, on the golden vectors at
every warmed batch size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kernel.contract import PolicyContract, TensorRole
from kernel.distributions import Distribution
from kernel.errors import InvalidInput, one_line
from kernel.spaces import ObservationBounds, parse_observations
from serve.batching.plan import bucket, buckets_for
from serve.dataplane.kinds import ModelKind
from serve.dataplane.messages import InferenceRequest, Prepared, SequenceStep
from serve.execution.graph_cut import cut_to
from serve.execution.runtime import CPU, Execution, Session, create_session
from serve.policy import masks, memory
from serve.policy.heads import PolicyHeads, action_outputs, needs_distribution
from serve.policy.masks import ActionMasks
from serve.policy.memory import MemoryInputs
from serve.policy.validation import ObservationValidator, predict_options
from serve.types import Answer, OutputKind, Outputs, PredictOptions

if TYPE_CHECKING:
    from serve.config import FeatureView, Settings

log = logging.getLogger("rlserve.policy")

_ACTIONS_ONLY = frozenset({OutputKind.ACTIONS})


class PolicyVersion:
    model_kind: ClassVar[ModelKind] = ModelKind.ROWS

    def __init__(
        self,
        name: str,
        version: int,
        contract: PolicyContract,
        session: Session,
        sha256: str,
        max_batch_size: int,
        *,
        observation_bounds: ObservationBounds,
        features: FeatureView | None = None,
        actions: Session | None = None,
    ) -> None:
        self.name, self.version, self.contract, self.sha256 = name, version, contract, sha256
        self.features = features  # its own features view (None: its model's, if any)
        self.provider_report = session.report
        self.provider = session.report.primary
        self._session = session
        self._cut = actions  # the graph cut to action_outputs (action_session), if any
        self._actions: Session | None = None  # the cut, once warm_up found it exact
        self._observations = ObservationValidator(contract, bounds=observation_bounds)
        self._heads = PolicyHeads(contract)
        mask = contract.action_mask
        self._masks = (
            None if mask is None else ActionMasks(mask.name, contract.action_space, mask.shape[1])
        )
        self._memory = _memory_inputs(contract)
        # GPU providers run best at a few warmed shapes (engines and kernels are planned per
        # shape): batches are padded to them. On the CPU every extra row is compute wasted.
        gpu = self.provider != CPU
        self.batch_sizes = buckets_for(max_batch_size) if gpu else None

    # ------------------------------------------------------------------ request path

    def prepare(self, request: InferenceRequest) -> Prepared:
        inputs = request.inputs
        if "observations" not in inputs:
            raise InvalidInput("observations: required (one observation or a list of them)")
        batch = self._observations(inputs["observations"])
        given = inputs.get("actions")
        evaluate = None if given is None else self._given_actions(given, batch.rows, batch.single)
        options = predict_options(request.parameters)
        if not self._heads.stochastic and needs_distribution(options):
            raise InvalidInput(self._no_distribution(options))
        feeds = self._observations.feeds(batch)
        given_masks = inputs.get(masks.FIELD)
        if self._masks is not None:
            feeds[self._masks.name] = self._masks(given_masks, batch.rows, single=batch.single)
        elif given_masks is not None:
            raise InvalidInput(
                f"{masks.FIELD}: model {self.name!r} takes no action masks (its policy may "
                "take every action); leave them out"
            )
        sequence = self._sequence(request, batch.rows, feeds, single=batch.single)
        return Prepared(
            feeds,
            batch.rows,
            batch.single,
            options,
            evaluate,
            request.request_id,
            request.received_at,
            request.deadline,
            batch.out_of_bounds,
            sequence=sequence,
        )

    def _sequence(
        self,
        request: InferenceRequest,
        rows: int,
        feeds: dict[str, np.ndarray],
        *,
        single: bool,
    ) -> SequenceStep | None:
        """A recurrent policy's memory: given (into ``feeds``), or held by the server (the
        step returned). Refused for a feed-forward one."""
        inputs, parameters = request.inputs, request.parameters
        given = [name for name in (memory.STATE, memory.EPISODE_START) if name in inputs]
        named = [name for name in memory.SEQUENCE_PARAMETERS if name in parameters]
        if self._memory is None:
            if given or named:
                raise InvalidInput(
                    f"{(given + named)[0]}: model {self.name!r} is not recurrent (its answers "
                    "depend on the observation alone); leave state, episode_start and "
                    "sequence_* out"
                )
            return None
        if not named:
            held = self._memory(
                inputs.get(memory.STATE), inputs.get(memory.EPISODE_START), rows, single=single
            )
            feeds.update(self._memory.feeds(held))
            return None
        if given:
            raise InvalidInput(
                f"{given[0]}: the server holds the memory of sequence_id's sequences; leave "
                "state and episode_start out (sequence_start begins an episode)"
            )
        return self._memory.held(parameters, rows, single=single)

    def _no_distribution(self, options: PredictOptions) -> str:
        asked = "log_probs" if OutputKind.LOG_PROBS in options.outputs else "deterministic: false"
        algorithm = self.contract.algorithm.value.upper()
        return (
            f"{asked}: model {self.name!r} is a deterministic {algorithm} policy, with no "
            "distribution to sample from or score actions under; send deterministic: true "
            "(the default) and ask for outputs among actions, values"
            + (", q_values" if self._heads.has_q_values else "")
            + " (exploration noise is the caller's to add)"
        )

    def _given_actions(self, value: Any, rows: int, single: bool) -> np.ndarray:
        """Actions to score (log-probs of what the caller took), validated like observations."""
        try:
            given = parse_observations(self.contract.action_space, value, field="actions")
        except InvalidInput as exc:
            if exc.out_of_bounds:  # refused, as ever, but not counted: these are no observations
                raise InvalidInput(exc.message) from None
            raise
        if (given.rows, given.single) != (rows, single):
            raise InvalidInput(
                f"actions: give one action per observation; got {given.rows} "
                f"for {rows} observation{'s' if rows != 1 else ''}"
            )
        return given.arrays[None]

    def execute(self, inputs: dict[str, np.ndarray], requests: Sequence[Prepared]) -> Outputs:
        rows = sum(r.rows for r in requests)
        size = rows if self.batch_sizes is None else bucket(rows, self.batch_sizes)
        session = self._session
        if self._actions is not None and self._actions_only(requests):
            session = self._actions
        if size == rows:
            graph = session.run(inputs)
        else:
            padded = session.run({n: _fill(a, size) for n, a in inputs.items()})
            graph = {name: values[:rows] for name, values in padded.items()}
        return self._heads(graph, requests)

    def _actions_only(self, requests: Sequence[Prepared]) -> bool:
        """Whether the batch needs nothing of the graph but its actions (and next memory)."""
        return all(
            r.options.outputs == _ACTIONS_ONLY for r in requests
        ) and self._heads.answered_by_graph(requests)

    def distribution(self, outputs: Outputs) -> Distribution:
        """The action distribution of a batch this version ran with its whole graph."""
        return self._heads.distribution(outputs)

    def respond(self, request: Prepared, outputs: Outputs, start: int) -> Answer:
        rows = slice(start, start + request.rows)
        wanted = request.options.outputs
        answer: Answer = {}
        if OutputKind.ACTIONS in wanted:
            scored = request.evaluate is not None and needs_distribution(request.options)
            answer["actions"] = request.evaluate if scored else outputs["actions"][rows]
        if OutputKind.LOG_PROBS in wanted:
            answer["log_probs"] = outputs["log_probs"][rows]
        if OutputKind.VALUES in wanted and "values" in outputs:
            answer["values"] = outputs["values"][rows]
        if OutputKind.Q_VALUES in wanted and "q_values" in outputs:
            answer["q_values"] = outputs["q_values"][rows]
        if OutputKind.DISTRIBUTION in wanted:
            answer["distribution"] = {role: outputs[role][rows] for role in self._heads.parameters}
        if self._memory is not None:  # whatever was asked: the client carries it to the next step
            answer[memory.STATE] = outputs[memory.STATE][rows]
        return answer

    def warm_up(self, sizes: Sequence[int]) -> dict[int, float]:
        """Run every batch size once warm (the seconds each took); the graph cut to the
        actions is served from then on if it gave the whole graph's outputs at each."""
        golden = self.contract.golden_feeds(self.contract.golden[0])
        seconds = {}
        exact = self._cut is not None
        for size in sizes:
            feeds = {k: _fill(v, size) for k, v in golden.items()}
            self._session.run(feeds)  # the first run of a size pays one-off costs
            started = time.perf_counter()
            whole = self._session.run(feeds)
            seconds[size] = time.perf_counter() - started
            exact = exact and self._cut_gives(whole, feeds, size)
        self._actions = self._cut if exact else None
        return seconds

    def _cut_gives(self, whole: Outputs, feeds: dict[str, np.ndarray], size: int) -> bool:
        """Whether the cut graph, warmed on ``feeds``, gives ``whole``'s outputs bit for bit."""
        assert self._cut is not None
        self._cut.run(feeds)  # its first run of the size pays one-off costs
        cut = self._cut.run(feeds)
        differ = [
            name
            for name in self._heads.action_outputs
            if not np.array_equal(cut[name], whole[name], equal_nan=cut[name].dtype.kind == "f")
        ]
        if differ:
            log.warning(
                "%s/%s: the graph cut to its actions gives other %s than the whole graph at "
                "batch size %d; every batch runs the whole graph",
                self.name,
                self.version,
                differ,
                size,
            )
        return not differ

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "kind": self.contract.kind,
            "sha256": self.sha256,
            "provider": self.provider,
            "actions_graph": "whole" if self._actions is None else "cut",
            "contract": self.contract.model_dump(mode="json", by_alias=True),
        }


def _memory_inputs(contract: PolicyContract) -> MemoryInputs | None:
    """A recurrent policy's memory inputs (the contract was checked to have both)."""
    state = contract.input_of(TensorRole.STATE)
    start = contract.input_of(TensorRole.EPISODE_START)
    if contract.state is None or state is None or start is None:
        return None  # feed-forward
    return MemoryInputs(state.name, start.name, contract.state.size)


def _fill(array: np.ndarray, rows: int) -> np.ndarray:
    """The first ``rows`` rows, padded by repeating the last row where there are fewer."""
    if len(array) == rows:
        return array
    return array[np.minimum(np.arange(rows), len(array) - 1)]


def action_session(
    path: Path, contract: PolicyContract, session: Session, settings: Settings, origin: str
) -> Session | None:
    """A session over the version's graph cut to what actions-only batches need, for a
    version served on the CPU; None on a GPU provider (the critic costs next to nothing
    there) or when the cut would leave nothing out. It holds the actor's weights a second
    time."""
    if session.execution is not Execution.RUN or session.report.primary != CPU:
        return None
    try:
        cut = cut_to(path, action_outputs(contract))
    except Exception as exc:  # onnx raises assorted types for graphs it cannot read
        log.warning("%s: its graph cannot be cut to its actions (%s)", origin, one_line(exc))
        return None
    if cut is None:
        return None
    return create_session(cut, settings, f"{origin} (actions only)", execution=Execution.RUN)
