"""A policy as the Open Inference Protocol sees it: named tensors with datatypes and shapes.

Built once per loaded version from its policy contract (cached by the version's sha256):

- **inputs**: the contract's observation tensors, by their graph input names (``obs``, or
  one per key of a Dict space), datatype and shape from the contract with ``-1`` for the
  batch axis; ``action_mask`` (BOOL) for a policy that takes one; ``state`` (FP32) and
  ``episode_start`` (BOOL) for a recurrent one (optional: left out when every row starts
  an episode, or when the server holds the memory of the call's ``sequence_id``); and,
  not listed in the metadata, ``actions``: given actions to score.
- **outputs**: ``actions``, ``log_probs`` (when the policy has a distribution), ``values``
  (when it has a critic), ``q_values`` (a Q-network's), the distribution's parameters
  (``logits``, or ``mean`` and ``log_std``), and a recurrent policy's next ``state``.
- **parameters** of a request: ``deterministic`` (bool), ``seed`` (int), ``outputs`` (a
  comma-separated list, as an alternative to requesting outputs by name), ``timeout``
  (microseconds, Triton's name for a request deadline) and ``binary_data_output``; and,
  accepted without effect, ``priority`` and ``triton_enable_empty_final_response``.

A request naming no outputs gets all of them, as the protocol says. Tensors arrive here as
arrays (``serve.frontends.oip.tensors``); what is checked here is what the protocol can
say about a policy: every input present once, its datatype and its shape. Values (bounds,
finiteness, discrete ranges) are the policy's own checks, as for any request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernel.contract import PolicyContract, TensorRole
from kernel.errors import InvalidInput, listed, quoted
from serve.dataplane.messages import InferenceRequest
from serve.frontends.oip.shared_memory import PARAMETERS as SHARED_MEMORY_PARAMETERS
from serve.frontends.oip.shared_memory import PlacedInput, Placement
from serve.frontends.oip.tensors import DTYPES, datatype_of
from serve.types import Answer, OutputKind

ACTIONS = "actions"
# The request inputs a policy reads beside its observations, by the contract's role.
_EXTRA_INPUTS = {
    TensorRole.ACTION_MASK: "action_masks",
    TensorRole.STATE: "state",
    TensorRole.EPISODE_START: "episode_start",
}
EPISODE_KEY = "episode_key"
STATE = "state"  # a recurrent policy's output: the state to send with its next step
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end", "sequence_owner")
# Request parameters rlserve reads; any other is refused, naming these. Triton's clients
# send triton_enable_empty_final_response on every gRPC call: it only matters to decoupled
# models (several responses per request), which a policy never is, so it is accepted as is.
PARAMETERS = (
    "deterministic",
    "seed",
    "outputs",
    "entities",  # a model with a features view: entity ids (strings too), as its input may
    "sequence_id",  # Triton's sequence batcher's: a recurrent policy's server-held memory
    "sequence_start",
    "sequence_end",
    "sequence_owner",  # rlserve's: the key a client's sequences are held under
    "episode_key",  # rlserve's (gRPC): the episode a model's canary assigns to a version
    "timeout",
    "binary_data_output",
    "priority",
    "triton_enable_empty_final_response",
)
_KIND_OF = {
    "actions": OutputKind.ACTIONS,
    "log_probs": OutputKind.LOG_PROBS,
    "values": OutputKind.VALUES,
    "q_values": OutputKind.Q_VALUES,
}


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: the batch axis

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


# The parameters a requested output may carry, over either transport.
OUTPUT_PARAMETERS = frozenset({"binary_data", *SHARED_MEMORY_PARAMETERS})


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # the binary tensor data extension: None = the request's default
    placement: Placement | None = None  # written to system shared memory, not answered


@dataclass(slots=True)
class InferCall:
    """One infer call of either transport, decoded: tensors as arrays, parameters as values."""

    inputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    outputs: list[RequestedOutput]
    id: str = ""
    binary_output: bool = False  # HTTP: outputs not named otherwise go as binary data
    chosen: list[RequestedOutput] | None = None  # the outputs it gets, once checked
    placed: list[PlacedInput] = field(default_factory=list)  # inputs in system shared memory

    @property
    def in_shared_memory(self) -> bool:
        """Whether an input comes from, or an output goes to, a shared-memory region."""
        return bool(self.placed) or any(o.placement is not None for o in self.outputs)


@dataclass(frozen=True, slots=True)
class OutputTensor:
    name: str
    datatype: str
    values: np.ndarray  # in the advertised dtype, batch axis first
    binary: bool
    placement: Placement | None = None  # written there: the answer carries no data


class Signature:
    """A version's tensors by protocol name, and the mapping of calls and answers."""

    def __init__(self, contract: PolicyContract) -> None:
        observations = [
            TensorMetadata(spec.name, datatype_of(spec.dtype), _shape(spec.shape))
            for spec in contract.inputs
            if spec.role is TensorRole.OBSERVATION
        ]
        self._extras = [
            (TensorMetadata(spec.name, datatype_of(spec.dtype), _shape(spec.shape)), request_input)
            for role, request_input in _EXTRA_INPUTS.items()
            if (spec := contract.input_of(role)) is not None
        ]
        self._observation_inputs = observations
        self.inputs = [*observations, *(meta for meta, _ in self._extras)]
        # a recurrent policy's memory: left out at an episode's start, or held by the server
        self._optional = {
            spec.name
            for role in (TensorRole.STATE, TensorRole.EPISODE_START)
            if (spec := contract.input_of(role)) is not None
        }
        self._keys = {spec.name: spec.key for spec in contract.inputs}
        self._dict_space = any(key is not None for key in self._keys.values())
        self._actions = _from_spec(ACTIONS, contract, TensorRole.ACTION)
        outputs = [self._actions]
        if contract.distribution.kind.stochastic:
            outputs.append(TensorMetadata("log_probs", "FP32", (-1,)))
        if contract.output(TensorRole.VALUE) is not None:
            outputs.append(_from_spec("values", contract, TensorRole.VALUE))
        if contract.output(TensorRole.Q_VALUES) is not None:
            outputs.append(_from_spec("q_values", contract, TensorRole.Q_VALUES))
        for role in (TensorRole.LOGITS, TensorRole.MEAN, TensorRole.LOG_STD):
            if contract.output(role) is not None:
                outputs.append(_from_spec(role.value, contract, role))
        if contract.output(TensorRole.NEXT_STATE) is not None:
            outputs.append(_from_spec(STATE, contract, TensorRole.NEXT_STATE))
        self.outputs = outputs
        self._by_name = {o.name: o for o in outputs}
        self._all = [RequestedOutput(o.name) for o in outputs]
        self._parameter_outputs = {o.name for o in outputs} - set(_KIND_OF) - {STATE}
        self._inputs_by_name = {i.name: i for i in self.inputs}
        self._kinds_of: dict[tuple[str, ...], list[OutputKind] | None] = {}

    def field_of(self, name: str) -> str | None:
        """The predict field an input beside the observations is (``action_masks``,
        ``state``, ``episode_start``); None for an observation."""
        return next((field for meta, field in self._extras if meta.name == name), None)

    def key_of(self, name: str) -> str | None:
        """The key of a Dict space's observation that input ``name`` carries, or None."""
        key = self._keys.get(name)
        return None if key is None else str(key)

    # ------------------------------------------------------------------ calls

    def request(
        self, call: InferCall, request_id: str, received_at: float, deadline: float
    ) -> InferenceRequest:
        """The call as a protocol-neutral request (its inputs checked against the contract)."""
        self._check_inputs(call.inputs)
        return self._assembled(call, request_id, received_at, deadline)

    def laid_out_request(
        self, call: InferCall, request_id: str, received_at: float, deadline: float
    ) -> InferenceRequest:
        """``request`` for a call whose tensors were laid out from this very signature (a
        local lane's slot: their names, dtypes and shapes fixed when it opened and checked
        again whenever the served version changes, its rows checked per call): the same
        request, without checking its tensors a second time."""
        return self._assembled(call, request_id, received_at, deadline)

    def _assembled(
        self, call: InferCall, request_id: str, received_at: float, deadline: float
    ) -> InferenceRequest:
        tensors = call.inputs
        inputs: dict[str, Any] = {"observations": self._observed(tensors)}
        given = tensors.get(ACTIONS)
        if given is not None:
            inputs["actions"] = given
        for meta, request_input in self._extras:
            if meta.name in tensors:
                inputs[request_input] = tensors[meta.name]
        parameters = self._parameters(call)
        return InferenceRequest(inputs, parameters, request_id, received_at, deadline)

    def _check_inputs(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Every input named, typed and shaped as the contract says, with one batch size."""
        unknown = sorted(set(tensors) - set(self._inputs_by_name) - {ACTIONS})
        missing = sorted(set(self._inputs_by_name) - set(tensors) - self._optional)
        if unknown or missing:
            raise InvalidInput(
                f"inputs: this model takes {self._describe_inputs()}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {listed(unknown)}" if unknown else "")
            )
        rows = set()
        for meta in self.inputs:
            values = tensors.get(meta.name)
            if values is None:
                continue  # optional, and left out
            _check(meta, values)
            rows.add(len(values))
        if len(rows) > 1:
            raise InvalidInput(f"inputs: every input needs the same batch size; got {sorted(rows)}")
        given = tensors.get(ACTIONS)
        if given is not None:
            _check(self._actions, given)

    def _observed(self, tensors: Mapping[str, np.ndarray]) -> Any:
        """The observations the inputs carry: one array, or a Dict space's by key."""
        if not self._dict_space:
            return tensors[self._observation_inputs[0].name]
        return {str(self._keys[meta.name]): tensors[meta.name] for meta in self._observation_inputs}

    def _describe_inputs(self) -> str:
        return ", ".join(f"{i.name} ({i.datatype} {list(i.shape)})" for i in self.inputs)

    def _parameters(self, call: InferCall) -> dict[str, Any]:
        given = call.parameters
        unknown = sorted(set(given) - set(PARAMETERS))
        if unknown:
            raise InvalidInput(
                f"parameters: unknown parameter(s) {listed(unknown)}; this server reads "
                f"{list(PARAMETERS)}"
            )
        parameters: dict[str, Any] = {}
        if "deterministic" in given:
            parameters["deterministic"] = given["deterministic"]
        if "seed" in given:
            parameters["seed"] = given["seed"]
        for name in SEQUENCE_PARAMETERS:
            if name in given:
                parameters[name] = given[name]
        call.chosen = self.chosen(call)
        kinds = self._kinds(call.chosen)
        if kinds is not None:
            parameters["outputs"] = kinds
        return parameters

    def chosen(self, call: InferCall) -> list[RequestedOutput]:
        """The outputs a call gets: those it names, else those its ``outputs`` parameter
        lists, else all of them."""
        named = call.outputs or self._from_parameter(call.parameters.get("outputs"))
        if not named:
            return self._all
        seen = set()
        for output in named:
            if output.name not in self._by_name:
                raise InvalidInput(
                    f"outputs: {quoted(output.name)} is not an output of this model; "
                    f"its outputs are {list(self._by_name)}"
                )
            if output.name in seen:
                raise InvalidInput(f"outputs: {quoted(output.name)} is requested twice")
            seen.add(output.name)
        return named

    def _from_parameter(self, value: Any) -> list[RequestedOutput]:
        if value is None:
            return []
        if not isinstance(value, str) or not value.strip():
            got = quoted(value) if isinstance(value, str) else f"a {type(value).__name__}"
            raise InvalidInput(
                f"parameters.outputs: expected a comma-separated list drawn from "
                f"{list(self._by_name)}, got {got}"
            )
        return [RequestedOutput(name.strip()) for name in value.split(",")]

    def _kinds(self, chosen: Sequence[RequestedOutput]) -> list[OutputKind] | None:
        """The policy's output kinds for these outputs (None: actions alone, the default),
        remembered per choice of names."""
        names = tuple(output.name for output in chosen)
        if names in self._kinds_of:
            return self._kinds_of[names]
        kinds = {
            OutputKind.DISTRIBUTION if (k := _KIND_OF.get(n)) is None else k
            for n in names
            if n != STATE  # every answer of a recurrent policy carries it
        }
        listed = None if kinds <= {OutputKind.ACTIONS} else sorted(kinds)
        if len(self._kinds_of) < 256:  # names were checked: at most the outputs' subsets
            self._kinds_of[names] = listed
        return listed

    # ------------------------------------------------------------------ answers

    def answer(self, call: InferCall, answer: Answer) -> list[OutputTensor]:
        """The tensors a call asked for, from its answer (batch axis kept)."""
        tensors = []
        for output in call.chosen or self.chosen(call):
            if output.name == STATE and STATE not in answer:
                continue  # the server holds the sequence's memory: nothing to carry
            meta = self._by_name[output.name]
            if output.name in self._parameter_outputs:
                values = answer["distribution"][output.name]
            else:
                values = answer[output.name]
            array = np.asarray(values).astype(DTYPES[meta.datatype], copy=False)
            binary = call.binary_output if output.binary is None else output.binary
            tensors.append(
                OutputTensor(output.name, meta.datatype, array, binary, output.placement)
            )
        return tensors

    def output_bytes(self, name: str, rows: int) -> int:
        """The bytes output ``name`` takes for a call of ``rows`` rows."""
        meta = self._by_name[name]
        count = 1
        for dim in meta.shape:
            count *= rows if dim == -1 else dim
        return count * DTYPES[meta.datatype].itemsize


def config_dims(shape: tuple[int, ...]) -> tuple[list[int], bool]:
    """A tensor's dims in Triton's model configuration of a batching model (no batch axis),
    and whether it is a scalar per row (written dims [1], reshaped to [])."""
    dims = list(shape[1:]) if shape and shape[0] == -1 else list(shape)
    return (dims or [1]), not dims


def _shape(shape: Sequence[int | str]) -> tuple[int, ...]:
    return tuple(-1 if isinstance(d, str) else d for d in shape)


def _from_spec(name: str, contract: PolicyContract, role: TensorRole) -> TensorMetadata:
    spec = contract.output(role)
    assert spec is not None
    return TensorMetadata(name, datatype_of(spec.dtype), _shape(spec.shape))


def _check(meta: TensorMetadata, values: np.ndarray) -> None:
    """A tensor's datatype and shape against what the model takes."""
    given = datatype_of(values.dtype)
    if given != meta.datatype:
        raise InvalidInput(
            f"input {meta.name!r}: datatype {given} is not what this model takes; "
            f"send {meta.datatype} with shape {list(meta.shape)}"
        )
    shape = values.shape
    fits = len(shape) == len(meta.shape) and all(
        want in (-1, got) for want, got in zip(meta.shape, shape, strict=True)
    )
    if not fits or not shape or shape[0] == 0:
        raise InvalidInput(
            f"input {meta.name!r}: shape {list(shape)} does not fit {list(meta.shape)} "
            "(-1: any batch size of at least 1)"
        )
