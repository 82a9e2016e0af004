"""The policy contract: what an exported model declares about itself.

A contract is JSON stored in the ONNX file's ``metadata_props`` under :data:`METADATA_KEY`,
with schema :data:`SCHEMA` (``rlserve.policy/v1``). It says which spaces the policy lives in,
which tensor plays which role, which preprocessing is baked into the graph, where the
weights came from, and holds golden vectors (observation -> expected outputs) that any
loader re-runs to prove the file is intact.

This module needs neither torch nor the ``onnx`` package: the exporter writes contracts
with it and the server reads them through onnxruntime.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.distributions import DistributionKind
from kernel.errors import ContractError, one_line
from kernel.spaces import Space, leaves, parse_observations

SCHEMA = "rlserve.policy/v1"
METADATA_KEY = "rlserve.policy"


class Algorithm(StrEnum):
    PPO = "ppo"
    A2C = "a2c"
    SAC = "sac"
    TD3 = "td3"
    DDPG = "ddpg"
    DQN = "dqn"
    QRDQN = "qrdqn"  # sb3-contrib
    TQC = "tqc"  # sb3-contrib
    MASKABLE_PPO = "maskable_ppo"  # sb3-contrib: PPO acting under action masks
    RECURRENT_PPO = "recurrent_ppo"  # sb3-contrib: PPO with LSTM policies
    DPO = "dpo"
    GRPO = "grpo"


class TensorRole(StrEnum):
    OBSERVATION = "observation"  # input: one leaf of the observation space
    ACTION_MASK = "action_mask"  # input: bool [batch, n], True where an action is legal
    STATE = "state"  # input: a recurrent policy's memory, float32 [batch, size] (StateLayout)
    EPISODE_START = "episode_start"  # input: bool [batch], True resets the row's memory to zeros
    NEXT_STATE = "next_state"  # output: the memory after this step, to send with the next one
    ACTION = "action"  # output: the deterministic action, in the environment's action space
    LOGITS = "logits"  # output: categorical / bernoulli parameters
    MEAN = "mean"  # output: gaussian mean (before clipping)
    LOG_STD = "log_std"  # output: gaussian log standard deviation
    VALUE = "value"  # output: the critic's value of the state (off-policy: of the action), [batch]
    Q_VALUES = "q_values"  # output: a Q-network's value of each discrete action, [batch, n]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TensorSpec(_Model):
    name: str
    role: TensorRole
    dtype: str
    shape: list[int | str]  # "batch" marks the dynamic batch axis
    key: str | None = None  # the Dict observation key this input carries


class Source(_Model):
    framework: str  # "stable-baselines3", "torch"
    framework_version: str
    checkpoint: str  # file name of the checkpoint the weights came from
    sha256: str
    policy_class: str


class Normalization(_Model):
    """Observation normalisation baked into the graph: clip((obs - mean) / sqrt(var + eps))."""

    keys: list[str | None]  # the observation leaves that are normalised
    clip: float | None
    epsilon: float


class ImageScaling(_Model):
    key: str | None
    layout: Literal["HWC", "CHW"]  # the layout the graph input expects
    transposed_to_chw: bool  # the graph transposes HWC to CHW before the network
    scale: float  # multiplied into the pixels inside the graph (1/255), or 1


class Preprocessing(_Model):
    normalization: Normalization | None = None
    images: list[ImageScaling] = Field(default_factory=list)
    action_clip: bool  # the action output is clipped to the Box bounds


class StateSegment(_Model):
    """One recurrent network's hidden or cell state within a row of the state tensor."""

    name: str  # "actor.h", "actor.c", "critic.h", "critic.c"
    layers: int
    hidden: int

    @property
    def size(self) -> int:
        return self.layers * self.hidden


class StateLayout(_Model):
    """A recurrent policy's memory as one float32 row per observation: its segments one
    after another, each ``[layers, hidden]`` in row-major order. Zeros are the memory at
    an episode's start."""

    segments: list[StateSegment]

    @property
    def size(self) -> int:
        return sum(segment.size for segment in self.segments)


class DistributionSpec(_Model):
    kind: DistributionKind
    nvec: list[int] | None = None  # for multi_categorical


class Exporter(_Model):
    name: str = "rlserve"
    version: str


class GoldenVector(_Model):
    observations: Any  # a batch of observations in request JSON form
    outputs: dict[str, Any]  # output tensor name -> expected values
    action_masks: Any = None  # for a policy with an action mask: one row per observation
    state: Any = None  # for a recurrent policy: the memory fed with each observation
    episode_start: Any = None  # for a recurrent policy: one boolean per observation


class PolicyContract(_Model):
    schema_: Literal["rlserve.policy/v1"] = Field("rlserve.policy/v1", alias="schema")
    kind: Literal["actor_critic"] = "actor_critic"
    algorithm: Algorithm
    source: Source
    observation_space: Space
    action_space: Space
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    distribution: DistributionSpec
    preprocessing: Preprocessing
    state: StateLayout | None = None  # a recurrent policy's memory; None: feed-forward
    policy_version: int
    exporter: Exporter
    opset: int
    created_at: str  # ISO 8601, UTC
    golden: list[GoldenVector]
    golden_atol: float = 1e-4  # float outputs, times (1 + |expected|); discrete ones exactly

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    def output(self, role: TensorRole) -> TensorSpec | None:
        return next((o for o in self.outputs if o.role is role), None)

    @property
    def action_mask(self) -> TensorSpec | None:
        """The action-mask input of a policy that takes one (MaskablePPO)."""
        return self.input_of(TensorRole.ACTION_MASK)

    def input_of(self, role: TensorRole) -> TensorSpec | None:
        return next((i for i in self.inputs if i.role is role), None)

    def observation_feeds(self, observations: Any) -> dict[str, np.ndarray]:
        """Graph inputs for observations in request form (validated against the space)."""
        batch = parse_observations(self.observation_space, observations)
        return {
            spec.name: batch.arrays[spec.key]
            for spec in self.inputs
            if spec.role is TensorRole.OBSERVATION
        }

    def golden_feeds(self, golden: GoldenVector) -> dict[str, np.ndarray]:
        """Graph inputs for a golden vector: its observations, and its masks and memory if
        the policy takes them."""
        feeds = self.observation_feeds(golden.observations)
        given = {
            TensorRole.ACTION_MASK: (golden.action_masks, np.bool_),
            TensorRole.STATE: (golden.state, np.float32),
            TensorRole.EPISODE_START: (golden.episode_start, np.bool_),
        }
        for role, (value, dtype) in given.items():
            spec = self.input_of(role)
            if spec is not None:
                feeds[spec.name] = np.asarray(value, dtype=dtype)
        return feeds


def parse(text: str, origin: str) -> PolicyContract:
    """A contract from its JSON text; ContractError says what is wrong and where it came from."""
    try:
        raw = _json_object(text, origin)
        schema = raw.get("schema")
        if schema != SCHEMA:
            raise ContractError(
                f"{origin}: policy contract schema {schema!r} is not supported; this rlserve "
                f"reads {SCHEMA!r} (re-export the model with this version of rlserve)"
            )
        contract = PolicyContract.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ContractError(
            f"{origin}: invalid policy contract at {where}: {first['msg']}"
        ) from None
    _check_inputs_cover_space(contract, origin)
    _check_state(contract, origin)
    return contract


def _json_object(text: str, origin: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError(f"{origin}: policy contract is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ContractError(f"{origin}: policy contract must be a JSON object")
    return raw


def _check_inputs_cover_space(contract: PolicyContract, origin: str) -> None:
    keys = [k for k, _ in leaves(contract.observation_space)]
    declared = [i.key for i in contract.inputs if i.role is TensorRole.OBSERVATION]
    if sorted(map(str, keys)) != sorted(map(str, declared)):
        raise ContractError(
            f"{origin}: contract inputs carry observation keys {declared}, "
            f"but the observation space has {keys}"
        )


def _check_state(contract: PolicyContract, origin: str) -> None:
    """A recurrent contract takes its state and episode starts and returns the next state,
    each as wide as its layout; a feed-forward one has none of them."""
    specs = {role: contract.input_of(role) for role in (TensorRole.STATE, TensorRole.EPISODE_START)}
    specs[TensorRole.NEXT_STATE] = contract.output(TensorRole.NEXT_STATE)
    if contract.state is None:
        present = [role.value for role, spec in specs.items() if spec is not None]
        if present:
            raise ContractError(f"{origin}: tensors {present} need the contract's state layout")
        return
    size = contract.state.size
    expected = {
        TensorRole.STATE: ["batch", size],
        TensorRole.EPISODE_START: ["batch"],
        TensorRole.NEXT_STATE: ["batch", size],
    }
    for role, spec in specs.items():
        if spec is None or spec.shape != expected[role]:
            shown = "missing" if spec is None else f"shaped {spec.shape}"
            raise ContractError(
                f"{origin}: the {role.value} tensor is {shown}; a state layout of "
                f"{size} floats needs it shaped {expected[role]}"
            )


def kind_of(metadata: Mapping[str, str]) -> str | None:
    """The contract's ``kind`` (``actor_critic``, ``causal-lm``), read without validating it;
    None when the file has no contract or it is not JSON (``from_metadata`` says why)."""
    text = metadata.get(METADATA_KEY)
    try:
        raw = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    kind = raw.get("kind", "actor_critic") if isinstance(raw, dict) else None
    return kind if isinstance(kind, str) else None


def from_metadata(metadata: Mapping[str, str], origin: str) -> PolicyContract:
    """The contract in an ONNX model's metadata_props (as onnxruntime reports them)."""
    text = metadata.get(METADATA_KEY)
    if text is None:
        raise ContractError(
            f"{origin}: the ONNX file has no policy contract (metadata key {METADATA_KEY!r}); "
            "export it with `rlserve export`, which embeds one"
        )
    return parse(text, origin)


def read(path: str | Path) -> PolicyContract:
    """The contract of an ONNX file on disk, read through onnxruntime."""
    return from_metadata(read_metadata(path), str(path))


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata_props of an ONNX file on disk (any kind of contract), via onnxruntime."""
    import onnxruntime as ort

    path = Path(path)
    if not path.is_file():
        raise ContractError(f"{path}: no such file; give the path of a model.onnx")
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own assorted types for bad files
        raise ContractError(f"{path}: not a loadable ONNX model ({one_line(exc)})") from None
    return dict(session.get_modelmeta().custom_metadata_map)


Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def check_golden(contract: PolicyContract, run: Runner) -> list[str]:
    """Re-run the golden vectors; returns one line per mismatch (empty when the file is intact)."""
    problems: list[str] = []
    for i, golden in enumerate(contract.golden):
        outputs = run(contract.golden_feeds(golden))
        for name, expected in golden.outputs.items():
            problem = _compare(outputs.get(name), np.asarray(expected), contract.golden_atol)
            if problem:
                problems.append(f"golden vector {i}, output {name!r}: {problem}")
    return problems


def _compare(actual: np.ndarray | None, expected: np.ndarray, atol: float) -> str | None:
    if actual is None:
        return "missing from the model's outputs"
    if actual.shape != expected.shape:
        return f"shape {actual.shape}, expected {expected.shape}"
    if expected.dtype.kind in "iub":
        mismatched = int(np.sum(actual != expected))
        return f"{mismatched} of {expected.size} values differ" if mismatched else None
    # The exporter's parity rule: |actual - expected| <= atol * (1 + |expected|), so values
    # far from zero are held to their float32 precision rather than to an absolute step.
    excess = np.abs(actual.astype(np.float64) - expected) - atol * (1 + np.abs(expected))
    if expected.size and not np.all(excess <= 0):
        worst = int(np.argmax(excess))
        return (
            f"value {actual.flat[worst]!s} differs from {expected.flat[worst]!s} by more than "
            f"{atol:g} x (1 + |expected|)"
        )
    return None
