"""A policy as Open Inference Protocol tensors (serve.frontends.oip.signature): the inputs and
outputs a contract advertises (the bundled CartPole model's, and contracts for a Dict of an
image, a discrete mode and a vector, and for a uint8 image with MultiDiscrete actions, with
tensors as the exporter declares them); calls checked and mapped to InferenceRequests; and
answers picked back into output tensors, through the real CartPole policy."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from export.actor_critic.tensors import input_specs, output_specs
from kernel import contract
from kernel.contract import PolicyContract
from kernel.errors import InvalidInput
from kernel.spaces import Dict, ObservationBounds
from serve import config
from serve.config import ModelSettings
from serve.control.repository import load_file
from serve.dataplane.messages import InferenceRequest
from serve.dataplane.model import RowModel, as_rows
from serve.frontends.oip.signature import (
    PARAMETERS,
    InferCall,
    RequestedOutput,
    Signature,
    TensorMetadata,
)
from serve.policy.validation import ObservationValidator
from serve.types import Answer
from tests.serve.inprocess import REPOSITORY
from tests.serve.policy.contracts import contract as hand_written

MODEL = REPOSITORY / "cartpole" / "1" / "model.onnx"
CARTPOLE = contract.read(MODEL)
IMAGE = {"type": "Box", "shape": [4, 4, 3], "dtype": "uint8", "low": 0, "high": 255}
POSITION = {"type": "Box", "shape": [3], "dtype": "float32", "low": -5.0, "high": 5.0}
DICT = {
    "type": "Dict",
    "spaces": {"camera": IMAGE, "mode": {"type": "Discrete", "n": 3}, "position": POSITION},
}
STEER = {"type": "Box", "shape": [2], "dtype": "float32", "low": -1.0, "high": 1.0}
CHOICES = {"type": "MultiDiscrete", "nvec": [2, 3]}


def exported(observation_space: dict[str, Any], action_space: dict[str, Any]) -> PolicyContract:
    """A contract for these spaces with the graph tensors the exporter declares for them."""
    written = hand_written(observation_space, action_space)
    actions = written.action_space
    assert not isinstance(actions, Dict)
    return written.model_copy(
        update={
            "inputs": input_specs(written.observation_space, actions, action_masks=False),
            "outputs": output_specs(actions, written.distribution.kind),
        }
    )


DICT_BOX = exported(DICT, STEER)
IMAGE_MULTI = exported(IMAGE, CHOICES)


def call(
    inputs: dict[str, np.ndarray], named: list[str] | None = None, **parameters: Any
) -> InferCall:
    """A call with these inputs, these outputs named, and these request parameters."""
    return InferCall(inputs, parameters, [RequestedOutput(o) for o in named or []])


def cartpole_obs(rows: int = 2) -> np.ndarray:
    return np.linspace(-0.2, 0.2, rows * 4, dtype=np.float32).reshape(rows, 4)


def dict_obs(rows: int = 2, **replaced: np.ndarray) -> dict[str, np.ndarray]:
    inputs: dict[str, np.ndarray] = {
        "obs.camera": np.full((rows, 4, 4, 3), 7, np.uint8),
        "obs.mode": np.arange(rows, dtype=np.int64) % 3,
        "obs.position": np.zeros((rows, 3), np.float32),
    }
    return inputs | replaced


def request(signature: Signature, given: InferCall) -> InferenceRequest:
    return signature.request(given, "req-1", 10.0, 11.0)


# --- metadata ---------------------------------------------------------------------------------


def test_cartpole_advertises_its_observation_and_every_output_with_a_batch_axis() -> None:
    signature = Signature(CARTPOLE)
    assert signature.inputs == [TensorMetadata("obs", "FP32", (-1, 4))]
    assert signature.outputs == [
        TensorMetadata("actions", "INT64", (-1,)),
        TensorMetadata("log_probs", "FP32", (-1,)),
        TensorMetadata("values", "FP32", (-1,)),
        TensorMetadata("logits", "FP32", (-1, 2)),
    ]
    assert signature.inputs[0].to_json() == {"name": "obs", "datatype": "FP32", "shape": [-1, 4]}


def test_a_dict_space_is_one_input_per_key_in_its_graph_dtype() -> None:
    signature = Signature(DICT_BOX)
    assert signature.inputs == [
        TensorMetadata("obs.camera", "UINT8", (-1, 4, 4, 3)),
        TensorMetadata("obs.mode", "INT64", (-1,)),
        TensorMetadata("obs.position", "FP32", (-1, 3)),
    ]
    assert signature.outputs == [
        TensorMetadata("actions", "FP32", (-1, 2)),
        TensorMetadata("log_probs", "FP32", (-1,)),
        TensorMetadata("values", "FP32", (-1,)),
        TensorMetadata("mean", "FP32", (-1, 2)),
        TensorMetadata("log_std", "FP32", (-1, 2)),
    ]


def test_an_image_with_multidiscrete_actions() -> None:
    signature = Signature(IMAGE_MULTI)
    assert signature.inputs == [TensorMetadata("obs", "UINT8", (-1, 4, 4, 3))]
    assert [(o.name, o.datatype, o.shape) for o in signature.outputs] == [
        ("actions", "INT64", (-1, 2)),
        ("log_probs", "FP32", (-1,)),
        ("values", "FP32", (-1,)),
        ("logits", "FP32", (-1, 5)),
    ]


def test_a_policy_without_a_critic_advertises_no_values() -> None:
    critic_less = CARTPOLE.model_copy(
        update={"outputs": [o for o in CARTPOLE.outputs if o.name != "value"]}
    )
    names = [o.name for o in Signature(critic_less).outputs]
    assert names == ["actions", "log_probs", "logits"]
    with pytest.raises(InvalidInput, match="'values' is not an output"):
        Signature(critic_less).chosen(call({}, ["values"]))


# --- requests: inputs -------------------------------------------------------------------------


def test_a_single_input_model_gets_its_tensor_as_the_observations() -> None:
    obs = cartpole_obs(3)
    made = request(Signature(CARTPOLE), call({"obs": obs}, ["actions"]))
    assert made.inputs["observations"] is obs
    assert set(made.inputs) == {"observations"}
    assert (made.request_id, made.received_at, made.deadline) == ("req-1", 10.0, 11.0)
    assert made.parameters == {}  # actions only: the default outputs


def test_a_dict_model_gets_its_observations_by_space_key() -> None:
    inputs = dict_obs(2)
    made = request(Signature(DICT_BOX), call(inputs))
    observations = made.inputs["observations"]
    assert set(observations) == {"camera", "mode", "position"}
    for key, values in observations.items():
        assert values is inputs[f"obs.{key}"]


def test_a_laid_out_call_makes_the_request_a_checked_one_makes() -> None:
    """The lane's request (its slot laid out from the signature: nothing checked again)
    equals the checked one, for a single input, a Dict space and given parameters."""
    cases = [
        (CARTPOLE, call({"obs": cartpole_obs()}, ["actions", "log_probs"], seed=3)),
        (DICT_BOX, call(dict_obs(), deterministic=False)),
    ]
    for model, given in cases:
        signature = Signature(model)
        checked = signature.request(given, "req-1", 10.0, 11.0)
        laid_out = signature.laid_out_request(given, "req-1", 10.0, 11.0)
        assert laid_out.parameters == checked.parameters
        assert (laid_out.request_id, laid_out.received_at, laid_out.deadline) == (
            checked.request_id, checked.received_at, checked.deadline,
        )  # fmt: skip
        assert laid_out.inputs.keys() == checked.inputs.keys()
        for name, values in checked.inputs.items():
            if isinstance(values, dict):
                assert all(laid_out.inputs[name][k] is v for k, v in values.items())
            else:
                assert laid_out.inputs[name] is values


@pytest.mark.parametrize("rows", [1, 3])
def test_the_observations_handed_on_are_rows_the_policys_validator_takes(rows: int) -> None:
    """Tensors always carry the batch axis: one row stays a batch of one, never a single
    observation (whose answer would lose the axis)."""
    image = np.zeros((rows, 4, 4, 3), np.uint8)
    for model, inputs in ((DICT_BOX, dict_obs(rows)), (IMAGE_MULTI, {"obs": image})):
        observations = request(Signature(model), call(inputs)).inputs["observations"]
        validator = ObservationValidator(model, bounds=ObservationBounds.REJECT)
        batch = validator(observations)
        assert (batch.rows, batch.single) == (rows, False)
        feeds = validator.feeds(batch)
        assert set(feeds) == set(inputs)
        for name, values in inputs.items():
            np.testing.assert_array_equal(feeds[name], values)


def test_given_actions_are_handed_on_to_be_scored() -> None:
    actions = np.array([1, 0], dtype=np.int64)
    made = request(Signature(CARTPOLE), call({"obs": cartpole_obs(), "actions": actions}))
    assert made.inputs["actions"] is actions
    steer = np.zeros((2, 2), np.float32)
    made = request(Signature(DICT_BOX), call(dict_obs(2) | {"actions": steer}))
    assert made.inputs["actions"] is steer


@pytest.mark.parametrize(
    ("actions", "problem"),
    [
        (np.array([1.0, 0.0], np.float32), "datatype FP32 .* send INT64 with shape \\[-1\\]"),
        (np.array([[1], [0]], np.int64), "shape \\[2, 1\\] does not fit \\[-1\\]"),
        (np.zeros(0, np.int64), "shape \\[0\\] does not fit"),
    ],
)
def test_given_actions_must_be_what_the_model_answers(actions: np.ndarray, problem: str) -> None:
    with pytest.raises(InvalidInput, match=f"input 'actions': {problem}"):
        request(Signature(CARTPOLE), call({"obs": cartpole_obs(), "actions": actions}))


def test_a_missing_input_is_named_with_what_the_model_takes() -> None:
    with pytest.raises(InvalidInput, match=r"takes obs \(FP32 \[-1, 4\]\); missing \['obs'\]"):
        request(Signature(CARTPOLE), call({}))
    inputs = dict_obs(2)
    del inputs["obs.mode"]
    with pytest.raises(InvalidInput, match=r"obs.mode \(INT64 \[-1\]\).*missing \['obs.mode'\]"):
        request(Signature(DICT_BOX), call(inputs))


def test_an_unknown_input_is_named() -> None:
    given = {"obs": cartpole_obs(), "observation": cartpole_obs()}
    with pytest.raises(InvalidInput, match=r"obs \(FP32 \[-1, 4\]\); unknown \['observation'\]"):
        request(Signature(CARTPOLE), call(given))
    with pytest.raises(InvalidInput, match=r"missing \['obs'\]; unknown \['x'\]"):
        request(Signature(CARTPOLE), call({"x": cartpole_obs()}))


def test_thousands_of_unknown_inputs_are_named_by_the_first_few_and_a_count() -> None:
    given = {"obs": cartpole_obs()} | {f"x{i:05}": cartpole_obs() for i in range(20_000)}
    with pytest.raises(InvalidInput) as caught:
        request(Signature(CARTPOLE), call(given))
    assert caught.value.message.endswith(
        "unknown ['x00000', 'x00001', 'x00002', … and 19,997 more]"
    )
    assert len(caught.value.message) < 200


def test_long_names_are_cut_in_messages() -> None:
    long = "a" * 20_000
    refusals = [
        lambda: request(Signature(CARTPOLE), call({"obs": cartpole_obs(), long: cartpole_obs()})),
        lambda: request(Signature(CARTPOLE), InferCall({"obs": cartpole_obs()}, {long: 1}, [])),
        lambda: Signature(CARTPOLE).chosen(call({}, [long])),
        lambda: Signature(CARTPOLE).chosen(call({}, outputs=long)),
    ]
    for refuse in refusals:
        with pytest.raises(InvalidInput) as caught:
            refuse()
        assert "(20,000 characters)" in caught.value.message
        assert len(caught.value.message) < 400


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int64, np.uint8, np.bool_])
def test_an_input_of_another_datatype_is_refused_naming_the_one_taken(dtype: type) -> None:
    obs: np.ndarray = cartpole_obs().astype(dtype)
    with pytest.raises(
        InvalidInput, match=r"input 'obs': datatype .* send FP32 with shape \[-1, 4\]"
    ):
        request(Signature(CARTPOLE), call({"obs": obs}))


@pytest.mark.parametrize("shape", [(2, 5), (4,), (2, 4, 1), (1, 2, 4), (), (0, 4), (2, 0)], ids=str)
def test_an_input_of_another_shape_is_refused(shape: tuple[int, ...]) -> None:
    obs = np.zeros(shape, np.float32)
    with pytest.raises(InvalidInput, match=r"input 'obs': shape .* does not fit \[-1, 4\]"):
        request(Signature(CARTPOLE), call({"obs": obs}))


def test_every_input_of_a_dict_model_is_checked() -> None:
    signature = Signature(DICT_BOX)
    with pytest.raises(InvalidInput, match=r"input 'obs\.mode': datatype INT32 .* send INT64"):
        request(signature, call(dict_obs(2, **{"obs.mode": np.zeros(2, np.int32)})))
    with pytest.raises(InvalidInput, match=r"input 'obs\.camera': datatype FP32 .* send UINT8"):
        request(signature, call(dict_obs(2, **{"obs.camera": np.zeros((2, 4, 4, 3), np.float32)})))
    camera = np.zeros((2, 3, 4, 4), np.uint8)  # CHW for an HWC input
    with pytest.raises(InvalidInput, match=r"'obs.camera': shape \[2, 3, 4, 4\] does not fit"):
        request(signature, call(dict_obs(2, **{"obs.camera": camera})))


def test_a_dict_models_inputs_need_one_batch_size() -> None:
    inputs = dict_obs(2, **{"obs.position": np.zeros((3, 3), np.float32)})
    with pytest.raises(InvalidInput, match=r"same batch size; got \[2, 3\]"):
        request(Signature(DICT_BOX), call(inputs))


# --- requests: parameters and outputs ---------------------------------------------------------


def test_unknown_parameters_are_refused_naming_those_read() -> None:
    given = call({"obs": cartpole_obs()}, temperature=0.5, correlation_id=3)
    with pytest.raises(
        InvalidInput, match=r"unknown parameter\(s\) \['correlation_id', 'temperature'\]"
    ) as caught:
        request(Signature(CARTPOLE), given)
    assert str(list(PARAMETERS)) in caught.value.message


@pytest.mark.parametrize(
    ("parameters", "outputs", "expected"),
    [
        ({}, ["actions"], {}),
        ({"deterministic": False, "seed": 7}, ["actions"], {"deterministic": False, "seed": 7}),
        ({"timeout": 5000, "binary_data_output": True, "priority": 1}, ["actions"], {}),
        ({"triton_enable_empty_final_response": True}, ["actions"], {}),  # perf_analyzer's
        ({}, None, {"outputs": ["actions", "distribution", "log_probs", "values"]}),
        ({}, ["logits"], {"outputs": ["distribution"]}),
        ({}, ["values", "actions"], {"outputs": ["actions", "values"]}),
        ({}, ["log_probs"], {"outputs": ["log_probs"]}),
        ({"outputs": "values"}, None, {"outputs": ["values"]}),
        ({"outputs": "actions"}, None, {}),
    ],
)
def test_the_request_carries_the_options_the_policy_reads(
    parameters: dict[str, Any], outputs: list[str] | None, expected: dict[str, Any]
) -> None:
    made = request(Signature(CARTPOLE), call({"obs": cartpole_obs()}, outputs, **parameters))
    assert made.parameters == expected


def test_the_distributions_parameters_are_one_output_kind() -> None:
    made = request(Signature(DICT_BOX), call(dict_obs(), ["log_std", "mean"]))
    assert made.parameters == {"outputs": ["distribution"]}


def test_outputs_named_are_chosen_in_the_order_named() -> None:
    chosen = Signature(CARTPOLE).chosen(call({}, ["logits", "actions", "values"]))
    assert [o.name for o in chosen] == ["logits", "actions", "values"]


def test_the_outputs_parameter_chooses_when_no_output_is_named() -> None:
    signature = Signature(DICT_BOX)
    chosen = signature.chosen(call({}, outputs="log_std, actions ,values"))
    assert chosen == [
        RequestedOutput("log_std"),
        RequestedOutput("actions"),
        RequestedOutput("values"),
    ]
    named = signature.chosen(call({}, ["mean"], outputs="values"))
    assert named == [RequestedOutput("mean")]  # outputs named win


def test_every_output_is_chosen_when_none_is_asked_for() -> None:
    for model in (CARTPOLE, DICT_BOX, IMAGE_MULTI):
        signature = Signature(model)
        chosen = signature.chosen(call({}))
        assert [o.name for o in chosen] == [o.name for o in signature.outputs]
        assert all(o.binary is None for o in chosen)


@pytest.mark.parametrize(
    ("outputs", "parameter"),
    [(["actions", "action"], None), (None, "actions,action"), (None, "mean")],
)
def test_an_unknown_output_is_refused_naming_the_outputs(
    outputs: list[str] | None, parameter: str | None
) -> None:
    given = call({}, outputs) if parameter is None else call({}, outputs=parameter)
    listed = r"\['actions', 'log_probs', 'values', 'logits'\]"
    match = rf"is not an output of this model; its outputs are {listed}"
    with pytest.raises(InvalidInput, match=match):
        Signature(CARTPOLE).chosen(given)


@pytest.mark.parametrize(
    ("outputs", "parameter"), [(["values", "values"], None), (None, "actions,logits,actions")]
)
def test_an_output_asked_for_twice_is_refused(
    outputs: list[str] | None, parameter: str | None
) -> None:
    given = call({}, outputs) if parameter is None else call({}, outputs=parameter)
    with pytest.raises(InvalidInput, match="is requested twice"):
        Signature(CARTPOLE).chosen(given)


@pytest.mark.parametrize("parameter", ["", "  ", 3, ["actions"], True])
def test_an_outputs_parameter_that_is_no_list_of_names_is_refused(parameter: Any) -> None:
    with pytest.raises(
        InvalidInput,
        match=r"parameters.outputs: expected a comma-separated list drawn from \['actions'",
    ):
        Signature(CARTPOLE).chosen(call({}, outputs=parameter))


def test_an_empty_name_in_the_outputs_parameter_is_no_output() -> None:
    with pytest.raises(InvalidInput, match="'' is not an output"):
        Signature(CARTPOLE).chosen(call({}, outputs="actions,,values"))


# --- answers ----------------------------------------------------------------------------------


def test_answers_are_picked_in_the_order_asked_in_the_advertised_dtypes() -> None:
    answer: Answer = {
        "actions": [[0.5, -0.5], [1.0, 0.0]],  # lists and float64 arrays, as a policy may give
        "log_probs": np.array([-1.0, -2.0]),
        "values": np.array([3.0, 4.0]),
        "distribution": {"mean": np.ones((2, 2)), "log_std": np.zeros((2, 2), np.float32)},
    }
    given = call(dict_obs(), ["log_std", "actions", "values", "mean", "log_probs"])
    tensors = Signature(DICT_BOX).answer(given, answer)
    assert [(t.name, t.datatype, t.values.dtype, t.values.shape) for t in tensors] == [
        ("log_std", "FP32", np.float32, (2, 2)),
        ("actions", "FP32", np.float32, (2, 2)),
        ("values", "FP32", np.float32, (2,)),
        ("mean", "FP32", np.float32, (2, 2)),
        ("log_probs", "FP32", np.float32, (2,)),
    ]
    np.testing.assert_array_equal(tensors[1].values, [[0.5, -0.5], [1.0, 0.0]])
    np.testing.assert_array_equal(tensors[3].values, np.ones((2, 2)))


def test_an_answers_tensors_are_binary_as_the_call_says() -> None:
    answer: Answer = {"actions": np.array([1, 0]), "log_probs": np.zeros(2), "values": np.zeros(2)}
    given = InferCall(
        {},
        {},
        [
            RequestedOutput("actions", True),
            RequestedOutput("log_probs"),
            RequestedOutput("values", False),
        ],
        binary_output=True,
    )
    tensors = Signature(CARTPOLE).answer(given, answer)
    assert [(t.name, t.binary) for t in tensors] == [
        ("actions", True),
        ("log_probs", True),  # the request's default
        ("values", False),
    ]
    given.binary_output = False
    assert [t.binary for t in Signature(CARTPOLE).answer(given, answer)] == [True, False, False]


# --- through the real CartPole policy ---------------------------------------------------------


@pytest.fixture(scope="module")
def cartpole() -> RowModel:
    return as_rows(
        load_file(
            "cartpole", 1, MODEL, config.load(), ModelSettings.model_validate({"max_batch_size": 4})
        )
    )


def run(served: RowModel, made: InferenceRequest) -> Answer:
    """The request as the scheduler runs it alone in a batch."""
    prepared = served.prepare(made)
    outputs = served.execute(prepared.feeds, [prepared])
    return served.respond(prepared, outputs, 0)


def graph(obs: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"obs": obs}), strict=True))


def test_every_output_of_a_cartpole_call_comes_from_the_graph(cartpole: RowModel) -> None:
    obs = cartpole_obs(3)
    signature = Signature(cartpole.contract)
    given = call({"obs": obs})
    now = time.monotonic()
    tensors = signature.answer(given, run(cartpole, signature.request(given, "r", now, now + 1)))
    assert [(t.name, t.datatype, t.values.dtype, t.values.shape) for t in tensors] == [
        ("actions", "INT64", np.int64, (3,)),
        ("log_probs", "FP32", np.float32, (3,)),
        ("values", "FP32", np.float32, (3,)),
        ("logits", "FP32", np.float32, (3, 2)),
    ]
    expected = graph(obs)
    actions, log_probs, values, logits = (t.values for t in tensors)
    np.testing.assert_array_equal(actions, expected["action"])
    np.testing.assert_allclose(values, expected["value"], rtol=1e-6)
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-6)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(log_probs, log_softmax[np.arange(3), actions], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("outputs", "parameter"),
    [
        (["logits"], None),
        (["values", "actions"], None),
        (None, "log_probs,values"),
        (["actions"], None),
    ],
)
def test_a_cartpole_call_gets_just_the_outputs_it_asks_for(
    cartpole: RowModel, outputs: list[str] | None, parameter: str | None
) -> None:
    signature = Signature(cartpole.contract)
    extra = {} if parameter is None else {"outputs": parameter}
    given = call({"obs": cartpole_obs(2)}, outputs, **extra)
    now = time.monotonic()
    tensors = signature.answer(given, run(cartpole, signature.request(given, "r", now, now + 1)))
    names = outputs if outputs is not None else (parameter or "").split(",")
    assert [t.name for t in tensors] == names
    assert all(len(t.values) == 2 for t in tensors)


def test_given_actions_are_scored_by_the_cartpole_policy(cartpole: RowModel) -> None:
    obs = cartpole_obs(2)
    signature = Signature(cartpole.contract)
    taken = np.array([1, 0], np.int64)
    given = call(
        {"obs": obs, "actions": taken}, ["actions", "log_probs"], deterministic=False, seed=3
    )
    now = time.monotonic()
    actions, log_probs = signature.answer(
        given, run(cartpole, signature.request(given, "r", now, now + 1))
    )
    np.testing.assert_array_equal(actions.values, taken)
    logits = graph(obs)["logits"].astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(log_probs.values, log_softmax[[0, 1], taken], rtol=1e-4, atol=1e-6)
