"""The Open Inference Protocol's HTTP wire format (serve.frontends.oip.rest): infer bodies
decoded (JSON alone, or a JSON header and binary tensor data after it, as tritonclient and
hand-written clients send them) with their deadline budget, and answers encoded so that a
client (tritonclient's own parser, and a parse by hand) reads back the same arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton

from kernel.errors import InvalidInput, MalformedRequest
from serve.dataplane.messages import InferenceResponse
from serve.frontends.http_calls import Call
from serve.frontends.oip.infer import InferAnswer
from serve.frontends.oip.rest import V2Path, decode_infer, encode_infer, match
from serve.frontends.oip.shared_memory import Placement
from serve.frontends.oip.signature import InferCall, OutputTensor, RequestedOutput
from serve.frontends.oip.tensors import DTYPES

DEFAULT_MS = 1000.0
SHA = "ab" * 32
OBS: np.ndarray = np.arange(8, dtype=np.float32).reshape(2, 4) / 7


def http_call(timeout_header: str | None = None) -> Call:
    return Call("req-1", 0.0, timeout_header=timeout_header)


def decode(body: bytes, header_length: int | None = None, **call: Any) -> InferCall:
    decoded, _ = decode_infer(body, header_length, http_call(**call), DEFAULT_MS)
    return decoded


def budget(payload: dict[str, Any], timeout_header: str | None = None) -> float:
    _, ms = decode_infer(orjson.dumps(payload), None, http_call(timeout_header), DEFAULT_MS)
    return ms


def binary_body(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, int]:
    encoded = orjson.dumps(header)
    return encoded + b"".join(chunks), len(encoded)


def fp32(name: str, shape: list[int], **extra: Any) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": shape, **extra}


def sized(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


# --- decoding: JSON bodies --------------------------------------------------------------------


def test_a_json_body_is_its_inputs_outputs_parameters_and_id() -> None:
    body = orjson.dumps(
        {
            "id": "call-7",
            "inputs": [
                fp32("obs", [2, 4], data=OBS.tolist()),
                {"name": "obs.mode", "datatype": "INT64", "shape": [2], "data": [2, 0]},
                {"name": "flags", "datatype": "BOOL", "shape": [2, 1], "data": [[True], [False]]},
            ],
            "outputs": [
                {"name": "actions"},
                {"name": "logits", "parameters": {"binary_data": True}},
            ],
            "parameters": {"seed": 3, "deterministic": False},
        }
    )
    decoded, ms = decode_infer(body, None, http_call(), DEFAULT_MS)
    assert decoded.id == "call-7"
    assert list(decoded.inputs) == ["obs", "obs.mode", "flags"]
    np.testing.assert_array_equal(decoded.inputs["obs"], OBS)
    assert decoded.inputs["obs"].dtype == np.float32
    assert decoded.inputs["obs.mode"].dtype == np.int64
    assert decoded.inputs["flags"].tolist() == [[True], [False]]
    assert decoded.outputs == [RequestedOutput("actions"), RequestedOutput("logits", True)]
    assert decoded.parameters == {"seed": 3, "deterministic": False}
    assert decoded.binary_output is False
    assert ms == DEFAULT_MS


def test_a_minimal_body_gets_no_id_no_outputs_and_no_parameters() -> None:
    decoded = decode(orjson.dumps({"inputs": [fp32("obs", [1, 4], data=[0.0] * 4)]}))
    assert (decoded.id, decoded.outputs, decoded.parameters) == ("", [], {})


def test_json_booleans_are_no_fp32_data_even_in_a_body_with_other_booleans() -> None:
    body = orjson.dumps(
        {
            "inputs": [fp32("obs", [1, 4], data=[0.0, 1.0, True, 0.5])],
            "parameters": {"binary_data_output": False},
        }
    )
    with pytest.raises(InvalidInput, match="input 'obs': FP32 data must be numbers, not true"):
        decode(body)


@pytest.mark.parametrize(
    ("datatype", "data", "wanted"),
    [
        ("FP32", [0.5, None], "numbers"),
        ("FP32", [None, None], "numbers"),
        ("INT64", [1, None], "integers"),
    ],
)
def test_json_null_in_data_is_invalid_input(datatype: str, data: list[Any], wanted: str) -> None:
    """null is what JSON encoders write for NaN: a client error (400), never a server one."""
    body = orjson.dumps(
        {"inputs": [{"name": "obs", "datatype": datatype, "shape": [2], "data": data}]}
    )
    with pytest.raises(InvalidInput, match=rf"input 'obs': {datatype} data must be {wanted}"):
        decode(body)


def test_binary_data_output_makes_every_output_binary_by_default() -> None:
    body = {
        "inputs": [fp32("obs", [1, 4], data=[0.0] * 4)],
        "parameters": {"binary_data_output": True},
    }
    assert decode(orjson.dumps(body)).binary_output is True


# --- decoding: binary tensor data -------------------------------------------------------------


def test_tritonclients_binary_and_json_inputs_decode_to_its_arrays() -> None:
    mode: np.ndarray = np.array([2, 0], dtype=np.int64)
    image: np.ndarray = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    flags: np.ndarray = np.array([True, False])
    inputs = []
    for name, values, binary in [
        ("obs.position", OBS, True),
        ("obs.mode", mode, False),
        ("obs.camera", image, True),
        ("flags", flags, True),
    ]:
        tensor = triton.InferInput(name, list(values.shape), triton_datatype(values))
        tensor.set_data_from_numpy(values, binary_data=binary)
        inputs.append(tensor)
    outputs = [
        triton.InferRequestedOutput("actions", binary_data=True),
        triton.InferRequestedOutput("values", binary_data=False),
    ]
    body, header_length = triton.InferenceServerClient.generate_request_body(
        inputs, outputs, request_id="t-1", parameters={"seed": 11}
    )
    assert header_length is not None
    assert header_length < len(body)
    decoded = decode(body, header_length)
    for name, values in [
        ("obs.position", OBS),
        ("obs.mode", mode),
        ("obs.camera", image),
        ("flags", flags),
    ]:
        assert decoded.inputs[name].dtype == values.dtype, name
        np.testing.assert_array_equal(decoded.inputs[name], values)
    assert decoded.outputs == [RequestedOutput("actions", True), RequestedOutput("values", False)]
    assert decoded.parameters == {"seed": 11}
    assert decoded.id == "t-1"


def triton_datatype(values: np.ndarray) -> str:
    return str(triton.np_to_triton_dtype(values.dtype))


def test_each_binary_input_takes_its_own_bytes_in_input_order() -> None:
    a = np.array([1.5, -2.5], np.float32)
    b = np.array([[1, 2, 3]], np.int16)
    c = np.array([7], np.uint64)
    header = {
        "inputs": [
            sized("a", "FP32", [2], 8),
            {"name": "json", "datatype": "INT32", "shape": [1], "data": [5]},  # takes no bytes
            sized("b", "INT16", [1, 3], 6),
            sized("c", "UINT64", [1], 8),
        ]
    }
    body, length = binary_body(header, a.tobytes(), b.tobytes(), c.tobytes())
    decoded = decode(body, length)
    np.testing.assert_array_equal(decoded.inputs["a"], a)
    assert decoded.inputs["json"].tolist() == [5]
    np.testing.assert_array_equal(decoded.inputs["b"], b)
    np.testing.assert_array_equal(decoded.inputs["c"], c)
    assert decoded.inputs["c"].dtype == np.dtype("<u8")


def test_a_zero_sized_binary_input_takes_no_bytes() -> None:
    header = {"inputs": [sized("empty", "FP32", [0, 4], 0), sized("obs", "FP32", [2, 4], 32)]}
    body, length = binary_body(header, OBS.tobytes())
    decoded = decode(body, length)
    assert decoded.inputs["empty"].shape == (0, 4)
    np.testing.assert_array_equal(decoded.inputs["obs"], OBS)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_dimensions_past_what_any_request_carries_are_malformed(binary: bool) -> None:
    """[0, 2**63 - 1] holds no elements, so no byte or value count refuses it; its
    dimensions are refused before any array is made."""
    shape = [0, 2**63 - 1]
    given = sized("obs", "FP32", shape, 0) if binary else fp32("obs", shape, data=[])
    body, length = binary_body({"inputs": [given]})
    with pytest.raises(MalformedRequest, match=r"non-zero dimensions hold more than"):
        decode(body, length if binary else None)


def test_json_data_nested_to_another_shape_is_refused_and_flat_data_taken() -> None:
    nested = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]  # six values, as [3, 2]
    with pytest.raises(InvalidInput, match=r"data nested as \[3, 2\] for shape \[2, 3\]"):
        decode(orjson.dumps({"inputs": [fp32("obs", [2, 3], data=nested)]}))
    flat = decode(orjson.dumps({"inputs": [fp32("obs", [2, 3], data=[1.0, 2, 3, 4, 5, 6])]}))
    assert flat.inputs["obs"].tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


def test_long_names_and_values_are_cut_in_messages() -> None:
    long = "a" * 20_000
    cases: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
        ([fp32(long, [1], data=[1.0]), fp32(long, [1], data=[1.0])], {}),
        ([fp32(long, [1])], {}),
        ([fp32("obs", [1], data=[1.0])], {"id": [long]}),
        ([fp32("obs", [1], data=[1.0])], {"parameters": {"binary_data_output": long}}),
    ]
    for given, extra in cases:
        with pytest.raises(InvalidInput) as caught:
            decode(orjson.dumps({"inputs": given, **extra}))
        assert len(caught.value.message) < 300, caught.value.message[:300]


def test_a_header_length_past_the_body_is_malformed() -> None:
    body, _ = binary_body({"inputs": [sized("obs", "FP32", [2, 4], 32)]}, OBS.tobytes())
    with pytest.raises(
        MalformedRequest,
        match=rf"Inference-Header-Content-Length is {len(body) + 1}, "
        rf"but the body has only {len(body)} bytes",
    ):
        decode(body, len(body) + 1)


def test_a_header_length_cutting_the_json_short_is_malformed() -> None:
    body, length = binary_body({"inputs": [sized("obs", "FP32", [2, 4], 32)]}, OBS.tobytes())
    with pytest.raises(MalformedRequest, match="the JSON header does not parse"):
        decode(body, length - 1)


def test_binary_bytes_no_input_accounts_for_are_refused() -> None:
    body, length = binary_body(
        {"inputs": [sized("obs", "FP32", [2, 4], 32)]}, OBS.tobytes(), b"xyz"
    )
    with pytest.raises(
        InvalidInput, match="3 bytes of binary data that no input's binary_data_size accounts for"
    ):
        decode(body, length)
    json_only = {"inputs": [fp32("obs", [1, 4], data=[0.0] * 4)]}
    body, length = binary_body(json_only, b"\x00" * 4)
    with pytest.raises(InvalidInput, match="4 bytes of binary data"):
        decode(body, length)


def test_a_binary_data_size_running_past_the_end_is_refused() -> None:
    header = {"inputs": [sized("obs", "FP32", [2, 4], 32), sized("mode", "INT64", [2], 16)]}
    body, length = binary_body(header, OBS.tobytes(), b"\x00" * 8)
    with pytest.raises(
        InvalidInput,
        match=r"input 'mode': binary_data_size 16 runs past the end of the body "
        r"\(8 bytes of binary data left\)",
    ):
        decode(body, length)


def test_binary_data_without_the_header_length_has_no_bytes() -> None:
    body, _ = binary_body({"inputs": [sized("obs", "FP32", [2, 4], 32)]})
    with pytest.raises(InvalidInput, match=r"runs past the end of the body \(0 bytes"):
        decode(body)


def test_a_binary_data_size_that_does_not_fit_the_shape_is_refused() -> None:
    body, length = binary_body({"inputs": [sized("obs", "FP32", [2, 4], 28)]}, OBS.tobytes()[:28])
    with pytest.raises(InvalidInput, match=r"input 'obs': 28 bytes .* needs 32"):
        decode(body, length)


@pytest.mark.parametrize("size", [-4, 3.0, "32", True, None])
def test_a_binary_data_size_must_be_a_byte_count(size: Any) -> None:
    given = fp32("obs", [2, 4], parameters={"binary_data_size": size})
    body, length = binary_body({"inputs": [given]}, OBS.tobytes())
    match = "give its data" if size is None else "binary_data_size must be a byte count"
    with pytest.raises(InvalidInput, match=f"input 'obs': {match}"):
        decode(body, length)


# --- decoding: what a body can get wrong ------------------------------------------------------


@pytest.mark.parametrize("body", [b"[]", b'"inputs"', b"1", b"null", b"true"])
def test_a_body_that_is_no_json_object_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedRequest, match="expected a JSON object like"):
        decode(body)


@pytest.mark.parametrize("body", [b"", b"{", b'{"inputs": [}', b"{'inputs': []}", b"\xff\xfe"])
def test_a_body_that_does_not_parse_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedRequest, match="infer request: the JSON header does not parse"):
        decode(body)


@pytest.mark.parametrize("inputs", [None, {}, "obs"])
def test_inputs_must_be_a_list(inputs: Any) -> None:
    body = {} if inputs is None else {"inputs": inputs}
    with pytest.raises(InvalidInput, match="inputs: expected a list"):
        decode(orjson.dumps(body))


def test_an_empty_list_of_inputs_is_read_for_the_model_to_judge() -> None:
    """A call by entity names them in its parameters and gives no input; a model that
    takes observations refuses it, naming what it takes (tests/e2e/test_oip.py)."""
    decoded = decode(orjson.dumps({"inputs": [], "parameters": {"entities": [1]}}))
    assert decoded.inputs == {}


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ([1], r"inputs\[0\]: expected an object, got int"),
        ([{"datatype": "FP32", "shape": [1], "data": [1.0]}], r"inputs\[0\]: needs name"),
        ([fp32("obs", [1], data=[1.0]), {"name": "x", "shape": [1]}], r"inputs\[1\]: needs name"),
        (
            [{"name": "obs", "datatype": "FP32", "shape": 4, "data": [1.0]}],
            r"shape \(list of integers\)",
        ),
        ([fp32("obs", [1])], "input 'obs': give its data, or binary_data_size and the bytes"),
        ([fp32("obs", [1], data=[1.0]), fp32("obs", [1], data=[2.0])], "'obs' is given twice"),
        (
            [fp32("obs", [1], data=[1.0], parameters=[1])],
            r"inputs\[0\].parameters: expected an object",
        ),
        ([fp32("obs", [-1, 4], data=[1.0] * 4)], "input 'obs': shape .* non-negative integers"),
        (
            [{"name": "obs", "datatype": "BF16", "shape": [1], "data": [1.0]}],
            "datatype 'BF16' is not supported",
        ),
    ],
)
def test_an_input_that_misdescribes_itself_is_refused(given: list[Any], match: str) -> None:
    with pytest.raises((InvalidInput, MalformedRequest), match=match):
        decode(orjson.dumps({"inputs": given}))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"parameters": [1]}, "parameters: expected an object, got list"),
        ({"parameters": {"binary_data_output": 1}}, "binary_data_output: expected true or false"),
        ({"id": 7}, "id: expected a string, got 7"),
        ({"outputs": {"name": "actions"}}, "outputs: expected a list"),
        ({"outputs": [{"name": 1}]}, r"outputs\[0\]: expected an object with a name"),
        ({"outputs": ["actions"]}, r"outputs\[0\]: expected an object with a name"),
        (
            {"outputs": [{"name": "a", "parameters": 1}]},
            r"outputs\[0\].parameters: expected an object",
        ),
        (
            {"outputs": [{"name": "a"}, {"name": "b", "parameters": {"classification": 2}}]},
            r"outputs\[1\].parameters: \['classification'\] not supported; "
            "an output takes binary_data",
        ),
        (
            {"outputs": [{"name": "a", "parameters": {"binary_data": 1}}]},
            r"outputs\[0\].parameters.binary_data: expected true or false",
        ),
    ],
)
def test_parameters_outputs_and_id_of_the_wrong_form_are_refused(
    extra: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidInput, match=match):
        decode(orjson.dumps({"inputs": [fp32("obs", [1], data=[1.0])], **extra}))


# --- decoding: the deadline budget ------------------------------------------------------------


def json_call(**parameters: Any) -> dict[str, Any]:
    return {"inputs": [fp32("obs", [1], data=[1.0])], "parameters": parameters}


@pytest.mark.parametrize(
    ("timeout_us", "expected_ms"),
    [(2500, 2.5), (1, 0.001), (999_999, 999.999), (1_000_000, DEFAULT_MS), (10**12, DEFAULT_MS)],
)
def test_the_timeout_parameter_in_microseconds_lowers_the_budget(
    timeout_us: int, expected_ms: float
) -> None:
    assert budget(json_call(timeout=timeout_us)) == pytest.approx(expected_ms)


@pytest.mark.parametrize("timeout_us", [0, -5, 2.5, 1000.0, "1000", True, [1000]])
def test_a_timeout_parameter_that_is_no_positive_integer_is_refused(timeout_us: Any) -> None:
    with pytest.raises(
        InvalidInput, match=r"parameters\.timeout: expected a positive number of microseconds"
    ):
        budget(json_call(timeout=timeout_us))


@pytest.mark.parametrize(
    ("header", "timeout_us", "expected_ms"),
    [
        ("250", None, 250.0),
        ("0.5", None, 0.5),
        ("5000", None, DEFAULT_MS),  # never more than the model's default
        ("250", 100_000, 100.0),  # the tighter of the two
        ("250", 400_000, 250.0),
    ],
)
def test_x_request_timeout_ms_lowers_the_budget(
    header: str, timeout_us: int | None, expected_ms: float
) -> None:
    parameters = {} if timeout_us is None else {"timeout": timeout_us}
    assert budget(json_call(**parameters), header) == pytest.approx(expected_ms)


@pytest.mark.parametrize("header", ["soon", "0", "-1", "inf", "nan", ""])
def test_a_timeout_header_that_is_no_positive_number_is_malformed(header: str) -> None:
    with pytest.raises(
        MalformedRequest, match="X-Request-Timeout-Ms: expected a positive number of milliseconds"
    ):
        budget(json_call(), header)


# --- encoding ---------------------------------------------------------------------------------


def answer(*tensors: OutputTensor, version: int = 3) -> InferAnswer:
    outputs = {t.name: t.values for t in tensors}
    return InferAnswer(InferenceResponse("cartpole", version, SHA, outputs, False), list(tensors))


ACTIONS = np.array([1, 0, 1], np.int64)
LOGITS = np.array([[0.1, -0.2], [1 / 3, 2.5], [-1e-8, 3.4e38]], np.float32)
VALUES = np.array([49.399200439453125, -0.0, 1e-40], np.float32)


def headers_of(pairs: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    as_dict = dict(pairs)
    assert len(as_dict) == len(pairs), "a header is given twice"
    return as_dict


def test_a_json_answer_carries_the_version_sha_id_and_each_tensor() -> None:
    tensors = [
        OutputTensor("actions", "INT64", ACTIONS, False),
        OutputTensor("logits", "FP32", LOGITS, False),
        OutputTensor("done", "BOOL", np.array([True, False, True]), False),
    ]
    body, pairs = encode_infer(answer(*tensors), InferCall({}, {}, [], "call-7"))
    headers = headers_of(pairs)
    assert headers[b"content-type"] == b"application/json"
    assert b"inference-header-content-length" not in headers
    assert headers[b"x-policy-version"] == b"3"
    assert headers[b"x-policy-sha256"] == SHA.encode()
    parsed = orjson.loads(body)
    assert parsed["model_name"] == "cartpole"
    assert parsed["model_version"] == "3"
    assert parsed["id"] == "call-7"
    assert parsed["parameters"] == {"model_sha256": SHA}
    assert parsed["outputs"] == [
        {"name": "actions", "datatype": "INT64", "shape": [3], "data": [1, 0, 1]},
        {
            "name": "logits",
            "datatype": "FP32",
            "shape": [3, 2],
            "data": LOGITS.reshape(-1).tolist(),
        },
        {"name": "done", "datatype": "BOOL", "shape": [3], "data": [True, False, True]},
    ]
    # FP32 data read back as float32 is the very tensor
    read = np.array(parsed["outputs"][1]["data"], np.float64).astype(np.float32).reshape(3, 2)
    assert read.tobytes() == LOGITS.tobytes()


def test_an_answer_to_a_call_without_an_id_has_none() -> None:
    body, _ = encode_infer(
        answer(OutputTensor("actions", "INT64", ACTIONS, False)), InferCall({}, {}, [])
    )
    assert "id" not in orjson.loads(body)


def parse_by_hand(body: bytes, header_length: int) -> dict[str, np.ndarray]:
    """An answer read as the protocol says: JSON, then each binary output's bytes in order."""
    header = orjson.loads(body[:header_length])
    arrays, offset = {}, header_length
    for output in header["outputs"]:
        dtype = DTYPES[output["datatype"]]
        if "data" in output:
            arrays[output["name"]] = np.array(output["data"], dtype).reshape(output["shape"])
            continue
        size = output["parameters"]["binary_data_size"]
        raw = body[offset : offset + size]
        arrays[output["name"]] = np.frombuffer(raw, dtype).reshape(output["shape"])
        offset += size
    assert offset == len(body), "bytes after the last binary output"
    return arrays


@pytest.mark.parametrize(
    "binary",
    [(True, True, True), (True, False, True), (False, True, False), (False, False, True)],
    ids=str,
)
def test_binary_answers_read_back_to_the_same_arrays(binary: tuple[bool, bool, bool]) -> None:
    tensors = [
        OutputTensor("actions", "INT64", ACTIONS, binary[0]),
        OutputTensor("logits", "FP32", LOGITS, binary[1]),
        OutputTensor("values", "FP32", VALUES, binary[2]),
    ]
    body, pairs = encode_infer(answer(*tensors), InferCall({}, {}, [], "b-1"))
    headers = headers_of(pairs)
    assert headers[b"content-type"] == b"application/octet-stream"
    assert headers[b"x-policy-version"] == b"3"
    length = int(headers[b"inference-header-content-length"])
    header = orjson.loads(body[:length])  # the JSON part ends exactly there
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"] if "parameters" in o]
    assert sizes == [t.values.nbytes for t in tensors if t.binary]
    assert length + sum(sizes) == len(body)
    assert all(("data" in o) != ("parameters" in o) for o in header["outputs"])
    by_hand = parse_by_hand(body, length)
    client = triton.InferenceServerClient.parse_response_body(body, header_length=length)
    assert client.get_response()["id"] == "b-1"
    assert client.get_response()["model_version"] == "3"
    for tensor in tensors:
        for read in (by_hand[tensor.name], client.as_numpy(tensor.name)):
            assert read.dtype == tensor.values.dtype, tensor.name
            assert read.shape == tensor.values.shape, tensor.name
            assert read.tobytes() == tensor.values.tobytes(), tensor.name


@pytest.mark.parametrize("datatype", [d for d in DTYPES if d != "BOOL"])
def test_every_datatype_goes_out_binary_and_comes_back(datatype: str) -> None:
    dtype = DTYPES[datatype]
    values = (np.arange(6) * 3).astype(dtype).reshape(2, 3)
    body, pairs = encode_infer(
        answer(OutputTensor("out", datatype, values, True)), InferCall({}, {}, [])
    )
    length = int(headers_of(pairs)[b"inference-header-content-length"])
    assert body[length:] == values.astype(dtype.newbyteorder("<")).tobytes()
    read = parse_by_hand(body, length)["out"]
    assert read.dtype == dtype
    assert read.tobytes() == values.tobytes()


def test_a_binary_bool_answer_is_one_byte_per_element() -> None:
    values = np.array([[True, False], [False, True]])
    body, pairs = encode_infer(
        answer(OutputTensor("b", "BOOL", values, True)), InferCall({}, {}, [])
    )
    length = int(headers_of(pairs)[b"inference-header-content-length"])
    assert body[length:] == b"\x01\x00\x00\x01"
    client = triton.InferenceServerClient.parse_response_body(body, header_length=length)
    np.testing.assert_array_equal(client.as_numpy("b"), values)


def test_a_decoded_call_and_its_encoded_answer_agree() -> None:
    """What a request body asks for is what its answer holds: the id echoed, the outputs
    binary as asked, each read back by tritonclient."""
    header = {
        "id": "round-trip",
        "inputs": [sized("obs", "FP32", [3, 4], 48)],
        "outputs": [
            {"name": "logits", "parameters": {"binary_data": False}},
            {"name": "actions"},
        ],
        "parameters": {"binary_data_output": True},
    }
    body, length = binary_body(header, np.zeros((3, 4), np.float32).tobytes())
    decoded = decode(body, length)
    binary = {
        o.name: decoded.binary_output if o.binary is None else o.binary for o in decoded.outputs
    }
    assert binary == {"logits": False, "actions": True}
    tensors = [
        OutputTensor("logits", "FP32", LOGITS, binary["logits"]),
        OutputTensor("actions", "INT64", ACTIONS, binary["actions"]),
    ]
    out, pairs = encode_infer(answer(*tensors), decoded)
    length = int(headers_of(pairs)[b"inference-header-content-length"])
    client = triton.InferenceServerClient.parse_response_body(out, header_length=length)
    assert client.get_response()["id"] == "round-trip"
    assert client.get_output("logits")["data"] == LOGITS.reshape(-1).tolist()
    np.testing.assert_array_equal(client.as_numpy("actions"), ACTIONS)


# --- system shared memory ---------------------------------------------------------------------


def shm(region: str, size: int, offset: int | None = None) -> dict[str, Any]:
    given: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": size}
    if offset is not None:
        given["shared_memory_offset"] = offset
    return given


def test_the_shared_memory_routes_name_their_region_and_action() -> None:
    assert match("/v2/systemsharedmemory/status") == V2Path(None, None, "shm_status")
    assert match("/v2/systemsharedmemory/unregister") == V2Path(None, None, "shm_unregister")
    assert match("/v2/systemsharedmemory/region/io/register") == V2Path(
        None, None, "shm_register", "io"
    )
    # tritonclient percent-encodes a name; it arrives decoded, '/' included
    assert match("/v2/systemsharedmemory/region/a/b/status") == V2Path(
        None, None, "shm_status", "a/b"
    )
    for path in ("/v2/systemsharedmemory", "/v2/systemsharedmemory/region//status"):
        assert match(path) == V2Path(None, None, "unknown"), path
    assert match("/v2/cudasharedmemory/region/g/register") == V2Path(
        None, None, "cuda_shm_register", "g"
    )
    assert match("/v2/cudasharedmemory/unregister") == V2Path(None, None, "cuda_shm_unregister")


def test_inputs_and_outputs_in_shared_memory_are_placed_not_decoded() -> None:
    body, length = binary_body(
        {
            "inputs": [
                fp32("obs", [2, 4], parameters=shm("io", 32, 8)),
                sized("mode", "INT64", [2], 16),
            ],
            "outputs": [
                {"name": "actions", "parameters": {"binary_data": False, **shm("io", 16)}},
                {"name": "values"},
            ],
        },
        np.array([2, 0], np.int64).tobytes(),
    )
    call = decode(body, length)
    assert list(call.inputs) == ["mode"]
    [placed] = call.placed
    assert (placed.name, placed.shape, placed.placement) == ("obs", [2, 4], Placement("io", 8, 32))
    assert [(o.name, o.placement) for o in call.outputs] == [
        ("actions", Placement("io", 0, 16)),
        ("values", None),
    ]


@pytest.mark.parametrize(
    ("payload", "wanted"),
    [
        ({"inputs": [fp32("obs", [1, 4], data=[0] * 4, parameters=shm("io", 16))]}, "one way"),
        ({"inputs": [fp32("obs", [1, 4], parameters={"shared_memory_byte_size": 16})]}, "both"),
        ({"inputs": [fp32("obs", [1, 4], parameters=shm("io", -1))]}, "a byte count"),
        (
            {
                "inputs": [fp32("obs", [1, 4], data=[0] * 4)],
                "outputs": [
                    {"name": "actions", "parameters": {"binary_data": True, **shm("r", 8)}}
                ],
            },
            "choose one",
        ),
    ],
)
def test_a_placement_given_wrongly_is_refused(payload: dict[str, Any], wanted: str) -> None:
    with pytest.raises(InvalidInput, match=wanted):
        decode(orjson.dumps(payload))


def test_an_output_in_shared_memory_is_answered_with_no_parameters_and_no_data() -> None:
    """As Triton answers it: Triton's C++ client reads any output parameters as binary data."""
    actions: np.ndarray = np.array([1, 0], np.int64)
    tensors = [
        OutputTensor("actions", "INT64", actions, False, Placement("io", 64, 256)),
        OutputTensor("values", "FP32", np.array([0.5, 1.5], np.float32), True),
    ]
    response = InferenceResponse("cartpole", 3, SHA, {}, False)
    body, headers = encode_infer(InferAnswer(response, tensors), InferCall({}, {}, []))
    length = int(dict(headers)[b"inference-header-content-length"])
    header = orjson.loads(body[:length])
    assert header["outputs"][0] == {"name": "actions", "datatype": "INT64", "shape": [2]}
    assert len(body) - length == 8  # the values' bytes alone
