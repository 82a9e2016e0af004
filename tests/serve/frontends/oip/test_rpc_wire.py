"""The Open Inference Protocol's gRPC messages (serve.frontends.oip.rpc): ModelInferRequests
decoded from raw_input_contents or typed contents, with their parameters and requested
outputs; and ModelInferResponses encoded so that tritonclient's InferResult reads back the
same arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferResult
from tritonclient.grpc import service_pb2 as triton_pb

from kernel.errors import InvalidInput, MalformedRequest
from serve.dataplane.messages import InferenceResponse
from serve.frontends.oip.infer import InferAnswer
from serve.frontends.oip.proto import inference_pb2 as pb
from serve.frontends.oip.rpc import (
    STATUS_MESSAGE_BYTES,
    decode_infer,
    encode_infer,
    status_message,
)
from serve.frontends.oip.shared_memory import Placement
from serve.frontends.oip.signature import InferCall, OutputTensor, RequestedOutput
from serve.frontends.oip.tensors import DTYPES

SHA = "cd" * 32
OBS: np.ndarray = np.arange(8, dtype=np.float32).reshape(2, 4) / 7
Input = pb.ModelInferRequest.InferInputTensor
Output = pb.ModelInferRequest.InferRequestedOutputTensor


def tensor(name: str, datatype: str, shape: list[int], **contents: Any) -> Any:
    typed = pb.InferTensorContents(**contents) if contents else None
    return Input(name=name, datatype=datatype, shape=shape, contents=typed)


def raw_request(*arrays: tuple[str, str, np.ndarray], **fields: Any) -> Any:
    return pb.ModelInferRequest(
        model_name="cartpole",
        inputs=[Input(name=n, datatype=d, shape=list(a.shape)) for n, d, a in arrays],
        raw_input_contents=[a.tobytes() for _, _, a in arrays],
        **fields,
    )


# --- decoding ---------------------------------------------------------------------------------


def test_raw_input_contents_are_the_inputs_in_order() -> None:
    mode: np.ndarray = np.array([2, 0], np.int64)
    image: np.ndarray = np.arange(96, dtype=np.uint8).reshape(2, 4, 4, 3)
    flags: np.ndarray = np.array([True, False])
    request = raw_request(
        ("obs.position", "FP32", OBS),
        ("obs.mode", "INT64", mode),
        ("obs.camera", "UINT8", image),
        ("flags", "BOOL", flags),
        id="call-1",
    )
    decoded = decode_infer(request)
    assert list(decoded.inputs) == ["obs.position", "obs.mode", "obs.camera", "flags"]
    for name, values in [
        ("obs.position", OBS),
        ("obs.mode", mode),
        ("obs.camera", image),
        ("flags", flags),
    ]:
        assert decoded.inputs[name].dtype == values.dtype, name
        assert decoded.inputs[name].shape == values.shape, name
        np.testing.assert_array_equal(decoded.inputs[name], values)
    assert decoded.id == "call-1"
    assert (decoded.outputs, decoded.parameters, decoded.binary_output) == ([], {}, False)


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [
        ("FP32", "fp32_contents", [0.1, -2.5, 3.4028234663852886e38, 1e-45]),
        ("FP64", "fp64_contents", [0.1, -2.5, 1e300, 5e-324]),
        ("INT64", "int64_contents", [-(2**63), 2**63 - 1, 0, -1]),
        ("INT32", "int_contents", [-(2**31), 2**31 - 1, 0, -1]),
        ("INT8", "int_contents", [-128, 127, 0, -1]),
        ("INT16", "int_contents", [-32768, 32767, 0, -1]),
        ("UINT8", "uint_contents", [0, 255, 1, 254]),
        ("UINT16", "uint_contents", [0, 65535, 1, 2]),
        ("UINT32", "uint_contents", [0, 2**32 - 1, 1, 2]),
        ("UINT64", "uint64_contents", [2**64 - 1, 2**63, 2**63 + 1, 2**64 - 2]),
        ("UINT64", "uint64_contents", [0, 2**64 - 1, 1, 2]),  # small and large together
        ("BOOL", "bool_contents", [True, False, False, True]),
    ],
)
def test_typed_contents_are_taken_in_their_datatype(
    datatype: str, field: str, values: list[Any]
) -> None:
    request = pb.ModelInferRequest(inputs=[tensor("x", datatype, [2, 2], **{field: values})])
    decoded = decode_infer(request).inputs["x"]
    dtype = DTYPES[datatype]
    exact = np.float64 if dtype.kind == "f" else dtype  # floats: rounded from the double given
    expected = np.array(values, dtype=exact).astype(dtype).reshape(2, 2)
    assert decoded.dtype == DTYPES[datatype]
    assert decoded.tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    ("datatype", "field", "values", "valid"),
    [
        ("UINT8", "uint_contents", [256, 0], "0..255"),
        ("INT8", "int_contents", [200, 0], "-128..127"),
        ("INT16", "int_contents", [-40000, 0], "-32768..32767"),
        ("UINT16", "uint_contents", [70000, 0], "0..65535"),
    ],
)
def test_typed_contents_out_of_a_narrow_datatypes_range_are_refused(
    datatype: str, field: str, values: list[int], valid: str
) -> None:
    request = pb.ModelInferRequest(inputs=[tensor("x", datatype, [2], **{field: values})])
    with pytest.raises(InvalidInput, match=f"input 'x': {datatype} values must lie in {valid}"):
        decode_infer(request)


def test_typed_contents_must_hold_the_shapes_elements() -> None:
    request = pb.ModelInferRequest(inputs=[tensor("obs", "FP32", [2, 4], fp32_contents=[1.0] * 7)])
    with pytest.raises(
        InvalidInput, match=r"input 'obs': 7 values of data for shape \[2, 4\], which holds 8"
    ):
        decode_infer(request)
    empty = pb.ModelInferRequest(inputs=[tensor("obs", "FP32", [2, 4])])
    with pytest.raises(InvalidInput, match="input 'obs': 0 values"):
        decode_infer(empty)


def test_typed_contents_in_another_field_than_the_datatypes_are_no_data() -> None:
    request = pb.ModelInferRequest(inputs=[tensor("obs", "FP32", [2], int_contents=[1, 2])])
    with pytest.raises(InvalidInput, match="input 'obs': 0 values of data"):
        decode_infer(request)


def test_fp16_has_no_typed_contents_and_goes_raw() -> None:
    request = pb.ModelInferRequest(inputs=[tensor("h", "FP16", [2], fp32_contents=[1.0, 2.0])])
    with pytest.raises(InvalidInput, match="input 'h': FP16 data goes in raw_input_contents"):
        decode_infer(request)
    half = np.array([0.5, -1.0], np.float16)
    np.testing.assert_array_equal(decode_infer(raw_request(("h", "FP16", half))).inputs["h"], half)


def test_bytes_come_as_contents_or_raw_length_prefixed() -> None:
    typed = pb.ModelInferRequest(
        inputs=[tensor("entities", "BYTES", [2], bytes_contents=[b"a", b"\xc3\xa9"])]
    )
    raw = pb.ModelInferRequest(
        inputs=[tensor("entities", "BYTES", [2])],
        raw_input_contents=[b"\x01\x00\x00\x00a\x02\x00\x00\x00\xc3\xa9"],
    )
    for request in (typed, raw):
        assert decode_infer(request).inputs["entities"].tolist() == [b"a", "é".encode()]


@pytest.mark.parametrize("datatype", ["BF16", "fp32"])
def test_unsupported_datatypes_are_refused_naming_those_taken(datatype: str) -> None:
    typed = pb.ModelInferRequest(inputs=[tensor("obs", datatype, [1], fp32_contents=[1.0])])
    raw = pb.ModelInferRequest(
        inputs=[tensor("obs", datatype, [1])], raw_input_contents=[b"\x00" * 4]
    )
    for request in (typed, raw):
        with pytest.raises(
            InvalidInput,
            match=rf"input 'obs': datatype '{datatype}' is not supported; use one of \[.*'FP32'",
        ):
            decode_infer(request)


def test_raw_contents_need_one_entry_per_input() -> None:
    request = pb.ModelInferRequest(
        inputs=[tensor("obs", "FP32", [2, 4]), tensor("mode", "INT64", [2])],
        raw_input_contents=[OBS.tobytes()],
    )
    with pytest.raises(
        InvalidInput,
        match="raw_input_contents: 1 entries for 2 inputs not in shared memory; give one per",
    ):
        decode_infer(request)
    request.raw_input_contents.extend([b"\x00" * 16, b"\x00"])
    with pytest.raises(InvalidInput, match="raw_input_contents: 3 entries for 2 inputs"):
        decode_infer(request)


def test_raw_contents_must_be_the_shapes_worth_of_bytes() -> None:
    request = pb.ModelInferRequest(
        inputs=[tensor("obs", "FP32", [2, 4])], raw_input_contents=[OBS.tobytes()[:-4]]
    )
    with pytest.raises(InvalidInput, match=r"input 'obs': 28 bytes .* needs 32"):
        decode_infer(request)


def test_raw_bool_bytes_other_than_zero_and_one_are_refused() -> None:
    request = pb.ModelInferRequest(
        inputs=[tensor("b", "BOOL", [2])], raw_input_contents=[b"\x01\x02"]
    )
    with pytest.raises(InvalidInput, match="input 'b': BOOL bytes must be 0 or 1"):
        decode_infer(request)


def test_negative_dimensions_are_malformed() -> None:
    request = pb.ModelInferRequest(
        inputs=[tensor("obs", "FP32", [-1, 4])], raw_input_contents=[OBS.tobytes()]
    )
    with pytest.raises(MalformedRequest, match=r"input 'obs': shape .* non-negative integers"):
        decode_infer(request)


@pytest.mark.parametrize("shape", [[0, 2**63 - 1], [2**62, 0, 4]])
def test_dimensions_past_what_any_request_carries_are_malformed(shape: list[int]) -> None:
    """A zero makes the tensor empty, but no array has such dimensions: refused as REST
    refuses them, raw or typed."""
    match = r"input 'obs': shape .* non-zero dimensions hold more than 2,147,483,648"
    for request in (
        pb.ModelInferRequest(inputs=[tensor("obs", "FP32", shape)], raw_input_contents=[b""]),
        pb.ModelInferRequest(inputs=[tensor("obs", "FP32", shape, fp32_contents=[])]),
    ):
        with pytest.raises(MalformedRequest, match=match):
            decode_infer(request)


def test_raw_and_typed_contents_together_are_refused() -> None:
    given = raw_request(("obs", "FP32", np.zeros((1, 4), np.float32)))
    given.inputs[0].contents.fp32_contents.extend([0.0] * 4)
    with pytest.raises(InvalidInput, match="give its data one way"):
        decode_infer(given)


def shm_parameters(region: str, size: int, offset: int = 0) -> dict[str, Any]:
    given = {
        "shared_memory_region": pb.InferParameter(string_param=region),
        "shared_memory_byte_size": pb.InferParameter(int64_param=size),
    }
    if offset:
        given["shared_memory_offset"] = pb.InferParameter(int64_param=offset)
    return given


def test_inputs_and_outputs_in_shared_memory_are_placed_and_take_no_raw_entry() -> None:
    mode: np.ndarray = np.array([2, 0], np.int64)
    request = pb.ModelInferRequest(
        inputs=[
            Input(
                name="obs", datatype="FP32", shape=[2, 4], parameters=shm_parameters("io", 32, 8)
            ),
            Input(name="mode", datatype="INT64", shape=[2]),
        ],
        raw_input_contents=[mode.tobytes()],  # only the input not in shared memory has one
        outputs=[
            Output(name="actions", parameters=shm_parameters("io", 16, 64)),
            Output(name="values"),
        ],
    )
    call = decode_infer(request)
    assert list(call.inputs) == ["mode"]
    np.testing.assert_array_equal(call.inputs["mode"], mode)
    [placed] = call.placed
    assert (placed.name, placed.datatype, placed.shape) == ("obs", "FP32", [2, 4])
    assert placed.placement == Placement("io", 8, 32)
    assert [(o.name, o.placement) for o in call.outputs] == [
        ("actions", Placement("io", 64, 16)),
        ("values", None),
    ]
    request.raw_input_contents.append(b"\x00" * 32)  # an entry for the placed input too
    with pytest.raises(InvalidInput, match="2 entries for 1 inputs not in shared memory"):
        decode_infer(request)


def test_a_placement_needs_its_region_and_byte_size() -> None:
    half = {"shared_memory_region": pb.InferParameter(string_param="io")}
    request = pb.ModelInferRequest(
        inputs=[Input(name="obs", datatype="FP32", shape=[1, 4], parameters=half)]
    )
    with pytest.raises(
        InvalidInput, match="give both shared_memory_region and shared_memory_byte_size"
    ):
        decode_infer(request)


def test_an_input_given_twice_is_refused() -> None:
    raw = raw_request(("obs", "FP32", OBS), ("obs", "FP32", OBS))
    typed = pb.ModelInferRequest(inputs=[tensor("obs", "FP32", [1], fp32_contents=[1.0])] * 2)
    for request in (raw, typed):
        with pytest.raises(InvalidInput, match="inputs: 'obs' is given twice"):
            decode_infer(request)


def test_each_kind_of_parameter_is_its_value() -> None:
    request = raw_request(
        ("obs", "FP32", OBS),
        parameters={
            "deterministic": pb.InferParameter(bool_param=False),
            "seed": pb.InferParameter(int64_param=42),
            "outputs": pb.InferParameter(string_param="actions,values"),
            "scale": pb.InferParameter(double_param=0.25),
            "timeout": pb.InferParameter(uint64_param=5000),
            "priority": pb.InferParameter(),  # no value chosen
        },
    )
    parameters = decode_infer(request).parameters
    assert parameters == {
        "deterministic": False,
        "seed": 42,
        "outputs": "actions,values",
        "scale": 0.25,
        "timeout": 5000,
        "priority": None,
    }
    assert type(parameters["seed"]) is int
    assert type(parameters["deterministic"]) is bool


def test_outputs_are_requested_by_name_in_order() -> None:
    request = raw_request(
        ("obs", "FP32", OBS),
        outputs=[
            Output(name="logits"),
            Output(name="actions", parameters={"binary_data": pb.InferParameter(bool_param=True)}),
        ],
    )
    assert decode_infer(request).outputs == [RequestedOutput("logits"), RequestedOutput("actions")]


def test_output_parameters_other_than_binary_data_are_refused() -> None:
    request = raw_request(
        ("obs", "FP32", OBS),
        outputs=[
            Output(name="actions"),
            Output(name="logits", parameters={"classification": pb.InferParameter(int64_param=2)}),
        ],
    )
    with pytest.raises(
        InvalidInput, match=r"outputs: 'logits' parameters \['classification'\] are not supported"
    ):
        decode_infer(request)


@pytest.mark.parametrize(
    "parameter",
    [
        pb.InferParameter(int64_param=1),
        pb.InferParameter(string_param="true"),
        pb.InferParameter(double_param=1.0),
        pb.InferParameter(),  # no value chosen
    ],
)
def test_a_non_boolean_binary_data_output_is_refused(parameter: Any) -> None:
    request = raw_request(("obs", "FP32", OBS), parameters={"binary_data_output": parameter})
    refusal = r"parameters\.binary_data_output: expected true or false"
    with pytest.raises(InvalidInput, match=refusal):
        decode_infer(request)


def test_a_boolean_binary_data_output_is_taken() -> None:
    for value in (True, False):
        switch = pb.InferParameter(bool_param=value)
        request = raw_request(("obs", "FP32", OBS), parameters={"binary_data_output": switch})
        assert decode_infer(request).parameters == {"binary_data_output": value}


def test_an_outputs_non_boolean_binary_data_is_refused() -> None:
    request = raw_request(
        ("obs", "FP32", OBS),
        outputs=[
            Output(name="actions", parameters={"binary_data": pb.InferParameter(int64_param=1)})
        ],
    )
    with pytest.raises(
        InvalidInput, match=r"outputs: 'actions' parameters\.binary_data: expected true or false"
    ):
        decode_infer(request)


# --- status messages --------------------------------------------------------------------------


def wire_bytes(text: str) -> int:
    """Bytes of ``text`` in grpc-message: printable ASCII but '%' as is, other bytes %XX."""
    return sum(1 if 0x20 <= b <= 0x7E and b != ord("%") else 3 for b in text.encode())


def test_a_short_status_message_is_kept_whole() -> None:
    message = "model 'nope': unknown model; this server has ['cartpole'] (100% sure)"
    assert status_message(message) == message


@pytest.mark.parametrize("character", ["m", "é", "%", "\n", "🤖"])
def test_a_long_status_message_is_cut_to_fit_saying_how_much(character: str) -> None:
    message = "model '" + character * 20_000 + "': unknown model"
    fitted = status_message(message)
    assert wire_bytes(fitted) <= STATUS_MESSAGE_BYTES
    assert wire_bytes(fitted) > STATUS_MESSAGE_BYTES - 64  # as much as fits is kept
    kept, note = fitted.split("… (")
    assert message.startswith(kept)
    assert note == f"{len(message) - len(kept):,} of its {len(message):,} characters cut)"


def test_a_lone_surrogate_does_not_break_the_status() -> None:
    fitted = status_message("input '\ud800' is unknown")
    fitted.encode("utf-8")  # grpc sends the message as UTF-8
    assert fitted == "input '?' is unknown"


# --- encoding ---------------------------------------------------------------------------------


ACTIONS: np.ndarray = np.array([1, 0, 1], np.int64)
LOGITS: np.ndarray = np.array([[0.1, -0.2], [1 / 3, 2.5], [-1e-8, 3.4e38]], np.float32)
DONE: np.ndarray = np.array([True, False, True])


def encoded(call_id: str = "call-9") -> Any:
    tensors = [
        OutputTensor("actions", "INT64", ACTIONS, False),
        OutputTensor("logits", "FP32", LOGITS, True),  # binary or not, gRPC answers raw
        OutputTensor("done", "BOOL", DONE, False),
    ]
    response = InferenceResponse("cartpole", 4, SHA, {}, False)
    return encode_infer(InferAnswer(response, tensors), InferCall({}, {}, [], call_id))


def test_an_output_in_shared_memory_keeps_its_place_with_an_empty_raw_entry() -> None:
    """As Triton answers it: Triton's C++ client reads entry i for output i, unchecked."""
    tensors = [
        OutputTensor("actions", "INT64", ACTIONS, False, Placement("io", 64, 256)),
        OutputTensor("logits", "FP32", LOGITS, False),
    ]
    response = InferenceResponse("cartpole", 4, SHA, {}, False)
    message = encode_infer(InferAnswer(response, tensors), InferCall({}, {}, [], "c"))
    assert [o.name for o in message.outputs] == ["actions", "logits"]
    assert list(message.raw_output_contents) == [b"", LOGITS.tobytes()]
    assert not message.outputs[0].parameters
    assert list(message.outputs[0].shape) == list(ACTIONS.shape)
    read = InferResult(triton_pb.ModelInferResponse.FromString(message.SerializeToString()))
    np.testing.assert_array_equal(read.as_numpy("logits"), LOGITS)


def test_an_answer_carries_model_version_id_and_sha256() -> None:
    message = encoded()
    assert isinstance(message, pb.ModelInferResponse)
    assert message.model_name == "cartpole"
    assert message.model_version == "4"
    assert message.id == "call-9"
    assert set(message.parameters) == {"model_sha256"}
    assert message.parameters["model_sha256"].WhichOneof("parameter_choice") == "string_param"
    assert message.parameters["model_sha256"].string_param == SHA
    assert encoded("").id == ""


def test_an_answers_tensors_go_raw_in_order_and_decode_back() -> None:
    message = encoded()
    assert [(o.name, o.datatype, list(o.shape)) for o in message.outputs] == [
        ("actions", "INT64", [3]),
        ("logits", "FP32", [3, 2]),
        ("done", "BOOL", [3]),
    ]
    assert all(not o.HasField("contents") for o in message.outputs)
    assert len(message.raw_output_contents) == 3
    for output, raw, values in zip(
        message.outputs, message.raw_output_contents, (ACTIONS, LOGITS, DONE), strict=True
    ):
        read = np.frombuffer(raw, DTYPES[output.datatype]).reshape(list(output.shape))
        assert read.dtype == values.dtype, output.name
        assert read.tobytes() == values.tobytes(), output.name


def test_tritonclient_reads_an_answer_back_to_the_same_arrays() -> None:
    theirs = triton_pb.ModelInferResponse.FromString(encoded().SerializeToString())
    result = InferResult(theirs)
    for name, values in [("actions", ACTIONS), ("logits", LOGITS), ("done", DONE)]:
        read = result.as_numpy(name)
        assert read is not None, name
        assert read.dtype == values.dtype, name
        assert read.shape == values.shape, name
        assert read.tobytes() == values.tobytes(), name
    assert theirs.parameters["model_sha256"].string_param == SHA


def test_a_tritonclient_request_decodes_to_its_arrays() -> None:
    """Triton's own message for a request, carried across as bytes, decodes as ours."""
    theirs = triton_pb.ModelInferRequest(
        model_name="cartpole",
        id="t-2",
        inputs=[
            triton_pb.ModelInferRequest.InferInputTensor(name="obs", datatype="FP32", shape=[2, 4]),
            triton_pb.ModelInferRequest.InferInputTensor(
                name="actions", datatype="INT64", shape=[2]
            ),
        ],
        raw_input_contents=[OBS.tobytes(), np.array([1, 0], np.int64).tobytes()],
        parameters={"seed": triton_pb.InferParameter(int64_param=5)},
        outputs=[triton_pb.ModelInferRequest.InferRequestedOutputTensor(name="log_probs")],
    )
    decoded = decode_infer(pb.ModelInferRequest.FromString(theirs.SerializeToString()))
    np.testing.assert_array_equal(decoded.inputs["obs"], OBS)
    assert decoded.inputs["actions"].tolist() == [1, 0]
    assert (decoded.id, decoded.parameters, decoded.outputs) == (
        "t-2",
        {"seed": 5},
        [RequestedOutput("log_probs")],
    )
