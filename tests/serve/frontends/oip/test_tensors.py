"""Open Inference Protocol tensors (serve.frontends.oip.tensors): every datatype in and out of
raw little-endian bytes and JSON data, and each way a tensor can misdescribe itself refused
with a message that names the input and what it should be."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson
import pytest

from kernel.errors import InvalidInput, MalformedRequest
from serve.frontends.oip import tensors
from serve.frontends.oip.tensors import DTYPES, MAX_DIMS, MAX_ELEMENTS

INTEGERS = [name for name, dtype in DTYPES.items() if dtype.kind in "iu"]
FLOATS = [name for name, dtype in DTYPES.items() if dtype.kind == "f"]
NUMERIC = INTEGERS + FLOATS


def sample(datatype: str) -> np.ndarray:
    """A 2x3 tensor of the datatype that reaches its extremes (and a negative zero)."""
    dtype = DTYPES[datatype]
    if dtype.kind == "b":
        return np.array([[True, False, True], [False, False, True]])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0], [1, info.max - 1, info.min + 1]], dtype=dtype)
    finfo = np.finfo(dtype)
    values = [[finfo.max, finfo.min, finfo.smallest_subnormal], [-0.0, 0.1, 1 / 3]]
    return np.array(values, dtype=dtype)


def same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal dtype, shape and bytes (so -0.0 and every float bit count)."""
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes()


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(DTYPES))
def test_every_datatype_round_trips_through_raw_bytes(datatype: str) -> None:
    values = sample(datatype)
    raw = tensors.to_bytes(values)
    assert raw == values.astype(DTYPES[datatype].newbyteorder("<")).tobytes()
    assert len(raw) == values.size * DTYPES[datatype].itemsize
    same(tensors.from_bytes("x", datatype, [2, 3], raw), values)
    same(tensors.from_bytes("x", datatype, [2, 3], memoryview(raw)), values)  # a body's slice
    assert tensors.datatype_of(values.dtype) == datatype


@pytest.mark.parametrize("datatype", [d for d in DTYPES if DTYPES[d].itemsize > 1])
def test_big_endian_arrays_go_out_little_endian(datatype: str) -> None:
    values = sample(datatype)
    swapped = values.astype(values.dtype.newbyteorder(">"))
    assert tensors.to_bytes(swapped) == tensors.to_bytes(values)
    assert tensors.datatype_of(swapped.dtype) == datatype


def test_non_contiguous_arrays_go_out_row_major() -> None:
    values = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert tensors.to_bytes(values.T) == np.ascontiguousarray(values.T).tobytes()


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("datatype", list(DTYPES))
def test_every_datatype_round_trips_through_json(datatype: str, nested: bool) -> None:
    values = sample(datatype)
    flat = tensors.to_json(values)
    assert flat == values.reshape(-1).tolist()
    data = orjson.loads(orjson.dumps(flat if not nested else values.tolist()))  # over the wire
    same(tensors.from_json("x", datatype, [2, 3], data), values)


@pytest.mark.parametrize(
    "data",
    [
        [0.1, 1 / 3, 16777217, 3.4028234663852886e38, 1e-45, -0.0, 2.5e-39, 0.7],
        [0.1, 1 / 3, 16777217, 3.4028234663852886e38, 1e-45, -0.0, 2.5e-39, 0.7][::-1],
    ],
)
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_fp32_data_is_the_float32_of_each_given_number(data: list[Any], nested: bool) -> None:
    given = [data[:4], data[4:]] if nested else data
    values = tensors.from_json("obs", "FP32", [2, 4], given)
    same(values, np.array(data, dtype=np.float64).astype(np.float32).reshape(2, 4))


@pytest.mark.parametrize("datatype", list(DTYPES))
@pytest.mark.parametrize("shape", [[0], [2, 0], [0, 3]])
def test_empty_tensors_keep_their_datatype_and_shape(datatype: str, shape: list[int]) -> None:
    data: list[Any] = [] if shape[0] == 0 else [[], []]
    for values in (
        tensors.from_json("x", datatype, shape, data),
        tensors.from_bytes("x", datatype, shape, b""),
    ):
        assert values.dtype == DTYPES[datatype]
        assert list(values.shape) == shape


def test_bool_takes_json_booleans_flat_or_nested_and_bytes_zero_and_one() -> None:
    expected = np.array([[True, False], [False, True]])
    same(tensors.from_json("b", "BOOL", [2, 2], [True, False, False, True]), expected)
    same(tensors.from_json("b", "BOOL", [2, 2], [[True, False], [False, True]]), expected)
    same(tensors.from_bytes("b", "BOOL", [2, 2], b"\x01\x00\x00\x01"), expected)


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("UINT8", [0, 255]),
        ("INT8", [-128, 127]),
        ("UINT16", [0, 65535]),
        ("INT16", [-32768, 32767]),
        ("UINT32", [0, 2**32 - 1]),
        ("INT32", [-(2**31), 2**31 - 1]),
        ("INT64", [-(2**63), 2**63 - 1]),
        ("UINT64", [2**64 - 1, 2**64 - 2]),
        ("UINT64", [0, 2**64 - 1]),  # a small and a large value together
    ],
)
def test_integers_at_the_edges_of_their_range_are_taken(datatype: str, data: list[int]) -> None:
    values = tensors.from_json("x", datatype, [2], data)
    assert values.dtype == DTYPES[datatype]
    assert values.tolist() == data


# --- what a tensor can get wrong --------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(DTYPES))
def test_raw_bytes_must_be_exactly_the_shapes_worth(datatype: str) -> None:
    itemsize = DTYPES[datatype].itemsize
    for raw in (b"\x00" * (6 * itemsize - 1), b"\x00" * (6 * itemsize + itemsize), b""):
        with pytest.raises(
            InvalidInput, match=rf"input 'obs': {len(raw)} bytes .* needs {6 * itemsize}"
        ):
            tensors.from_bytes("obs", datatype, [2, 3], raw)


@pytest.mark.parametrize("datatype", list(DTYPES))
@pytest.mark.parametrize("count", [5, 7])
def test_json_data_must_hold_the_shapes_element_count(datatype: str, count: int) -> None:
    data = np.ones(count, DTYPES[datatype]).tolist()
    with pytest.raises(InvalidInput, match=rf"input 'obs': {count} values .* which holds 6"):
        tensors.from_json("obs", datatype, [2, 3], data)


@pytest.mark.parametrize(
    ("shape", "nesting"),
    [
        ([2, 3], [3, 2]),  # the same six elements, nested to another shape
        ([2, 3], [2, 2]),  # fewer elements
        ([2, 3], [2, 1, 3]),  # deeper
        ([6], [2, 3]),  # nested where the shape is flat
        ([1, 2, 3], [2, 3]),  # shallower
    ],
)
@pytest.mark.parametrize("datatype", list(DTYPES))
def test_nested_data_must_be_nested_exactly_as_the_shape(
    datatype: str, shape: list[int], nesting: list[int]
) -> None:
    data = np.ones(nesting, DTYPES[datatype]).tolist()
    match = re.escape(f"input 'obs': data nested as {nesting} for shape {shape}; nest it exactly")
    with pytest.raises(InvalidInput, match=match):
        tensors.from_json("obs", datatype, shape, data)


@pytest.mark.parametrize("datatype", list(DTYPES))
def test_flat_data_of_the_shapes_count_is_taken_for_any_shape(datatype: str) -> None:
    data = np.ones(6, DTYPES[datatype]).tolist()
    for shape in ([2, 3], [3, 2], [1, 6, 1], [6]):
        assert list(tensors.from_json("obs", datatype, shape, data).shape) == shape


@pytest.mark.parametrize(
    "shape",
    [
        [2, -1],  # negative
        [-1],
        [2.0, 3],  # a float, even an integral one
        ["2"],
        [True, 3],  # a JSON boolean is no dimension
        [2, None],
        [1] * (MAX_DIMS + 1),  # too many axes
    ],
)
def test_shapes_no_tensor_can_have_are_malformed(shape: list[Any]) -> None:
    match = rf"input 'obs': shape .* at most {MAX_DIMS} non-negative integers"
    with pytest.raises(MalformedRequest, match=match):
        tensors.from_json("obs", "FP32", shape, [1.0, 2.0, 3.0])
    with pytest.raises(MalformedRequest, match=match):
        tensors.from_bytes("obs", "FP32", shape, b"\x00" * 12)


@pytest.mark.parametrize(
    "shape",
    [
        [0, 2**63 - 1],  # no elements, but strides past any array
        [2**63 - 1, 0],
        [0, 2**20, 2**20, 2**20],
        [0, MAX_ELEMENTS + 1],
        [MAX_ELEMENTS + 1],
    ],
)
def test_dimensions_past_what_any_request_carries_are_malformed(shape: list[int]) -> None:
    match = rf"input 'obs': shape .* non-zero dimensions hold more than {MAX_ELEMENTS:,}"
    with pytest.raises(MalformedRequest, match=match):
        tensors.from_json("obs", "FP32", shape, [])
    with pytest.raises(MalformedRequest, match=match):
        tensors.from_bytes("obs", "FP32", shape, b"")


def test_an_empty_tensor_may_span_up_to_the_element_limit() -> None:
    for shape in ([0, MAX_ELEMENTS], [MAX_ELEMENTS, 0], [0, 2**16, 2**15]):
        assert list(tensors.from_bytes("obs", "UINT8", shape, b"").shape) == shape
        assert list(tensors.from_json("obs", "UINT8", shape, []).shape) == shape


def test_a_shape_of_thousands_of_axes_is_not_written_out() -> None:
    with pytest.raises(MalformedRequest, match="shape of 20,000 axes") as caught:
        tensors.from_bytes("obs", "FP32", [1] * 20_000, b"")
    assert len(caught.value.message) < 300


def test_long_names_and_datatypes_are_cut_in_messages() -> None:
    name, datatype = "n" * 20_000, "D" * 20_000
    for refuse in (
        lambda: tensors.from_bytes(name, "FP32", [2], b""),
        lambda: tensors.from_json(name, "FP32", [2], [1.0]),
        lambda: tensors.from_json(name, datatype, [2], [1.0, 2.0]),
        lambda: tensors.from_json("obs", "FP32", [1], ["s" * 20_000]),
    ):
        with pytest.raises(InvalidInput) as caught:
            refuse()
        assert len(caught.value.message) < 400, caught.value.message[:400]
        assert "(20,000 characters)" in caught.value.message


def test_eight_axes_are_a_shape() -> None:
    values = tensors.from_bytes("obs", "UINT8", [1] * MAX_DIMS, b"\x07")
    assert values.shape == (1,) * MAX_DIMS


@pytest.mark.parametrize("datatype", ["BF16", "fp32", "FLOAT32", ""])
def test_unsupported_datatypes_are_refused_naming_those_taken(datatype: str) -> None:
    for refuse in (
        lambda: tensors.from_json("obs", datatype, [1], [1.0]),
        lambda: tensors.from_bytes("obs", datatype, [1], b"\x00" * 4),
        lambda: tensors.dtype_of(datatype, "obs"),
    ):
        with pytest.raises(InvalidInput, match=r"input 'obs': datatype .* use one of") as caught:
            refuse()
        for name in DTYPES:
            assert repr(name) in caught.value.message


def test_dtypes_without_a_datatype_are_named() -> None:
    with pytest.raises(ValueError, match="complex64"):
        tensors.datatype_of(np.dtype(np.complex64))


@pytest.mark.parametrize(
    ("datatype", "data", "shape"),
    [
        ("FP32", [1.0, True, 0.5], [3]),  # mixed into a flat list of numbers
        ("FP32", [True, False, True], [3]),
        ("UINT8", [1, True, 7], [3]),  # UINT8's own fast path would take True as 1
        ("UINT8", [False, 0, 0], [3]),
        ("FP32", [[1.0, 2.0], [3.0, False]], [2, 2]),  # nested
        ("INT64", [[[1], [2]], [[3], [True]]], [2, 2, 1]),  # deeper
        ("FP64", [[True, 1.0]], [1, 2]),
        ("INT8", [True], [1]),
        ("FP16", [0.5, False], [2]),
    ],
)
def test_json_booleans_are_no_numbers(datatype: str, data: list[Any], shape: list[int]) -> None:
    with pytest.raises(InvalidInput, match=rf"input 'obs': {datatype} data must be numbers"):
        tensors.from_json("obs", datatype, shape, data, may_hold_booleans=True)


@pytest.mark.parametrize("data", [[1, 0], [1.0, 0.0], [[1], [0]], [True, 0]])
def test_bool_takes_no_numbers(data: list[Any]) -> None:
    with pytest.raises(InvalidInput, match="input 'b': BOOL data must be true or false"):
        tensors.from_json("b", "BOOL", [2], data)


@pytest.mark.parametrize("datatype", INTEGERS)
@pytest.mark.parametrize("data", [[1, 2.5], [1.0, 2.0], [[1], [2.0]], [0.5, 1]])
def test_integer_datatypes_take_no_floats(datatype: str, data: list[Any]) -> None:
    with pytest.raises(InvalidInput, match=rf"input 'obs': {datatype} data must be integers"):
        tensors.from_json("obs", datatype, [2], data)


@pytest.mark.parametrize(
    ("datatype", "data", "valid"),
    [
        ("UINT8", [1, 256], "0..255"),
        ("UINT8", [-1, 3], "0..255"),
        ("UINT8", [[0], [256]], "0..255"),
        ("INT8", [128, 0], "-128..127"),
        ("INT8", [0, -129], "-128..127"),
        ("UINT16", [65536, 0], "0..65535"),
        ("INT16", [32768, 0], "-32768..32767"),
        ("UINT32", [-1, 0], "0..4294967295"),
        ("UINT32", [2**32, 0], "0..4294967295"),
        ("INT32", [2**31, 0], "-2147483648..2147483647"),
        ("INT64", [2**63, 0], "-9223372036854775808..9223372036854775807"),
        ("UINT64", [-1, 0], "0..18446744073709551615"),
    ],
)
def test_integers_out_of_their_datatypes_range_are_refused(
    datatype: str, data: list[int], valid: str
) -> None:
    with pytest.raises(InvalidInput, match=rf"input 'obs': {datatype} values must lie in {valid}"):
        tensors.from_json("obs", datatype, [2], data)


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("INT64", [-(2**63) - 1]),  # past int64 and uint64 both: numpy keeps Python ints
        ("INT64", [1, 2**64]),
        ("UINT64", [2**64]),
    ],
)
def test_integers_past_64_bits_are_refused_as_out_of_range(datatype: str, data: list[int]) -> None:
    with pytest.raises(InvalidInput, match=rf"input 'obs': {datatype} "):
        tensors.from_json("obs", datatype, [len(data)], data)


@pytest.mark.parametrize(
    ("datatype", "data", "wanted"),
    [
        ("FP32", [1.0, "2"], "numbers"),
        ("FP32", ["a", "b"], "numbers"),
        ("UINT8", [{"v": 1}, 2], "integers"),
        ("INT64", ["1", 2], "integers"),
        ("BOOL", ["true", False], "true or false"),
        # JSON null (what many encoders write for NaN) is no number either
        ("FP32", [1.0, None], "numbers"),
        ("FP32", [None, None], "numbers"),
        ("INT32", [1, None], "integers"),
        ("UINT8", [None, 1], "integers"),
        ("BOOL", [True, None], "true or false"),
    ],
)
def test_json_values_of_another_kind_are_refused(
    datatype: str, data: list[Any], wanted: str
) -> None:
    with pytest.raises(InvalidInput, match=rf"input 'obs': {datatype} data must be {wanted}"):
        tensors.from_json("obs", datatype, [2], data)


@pytest.mark.parametrize("data", [{"a": 1}, 1.5, "1,2", None, True])
def test_json_data_must_be_a_list(data: Any) -> None:
    with pytest.raises(InvalidInput, match=r"input 'obs': data must be a list of 2 FP32 values"):
        tensors.from_json("obs", "FP32", [2], data)


RAGGED = ["[[{0}, {1}], [{2}]]", "[{0}, [{1}, {2}]]", "[[{0}], {1}]", "[[[{0}, {1}]], [[{2}]]]"]
ELEMENTS = {
    "FP32": ("1.5", "2.5", "3.5"),
    "UINT8": ("1", "2", "3"),
    "INT64": ("1", "2", "3"),
    "BOOL": ("true", "false", "true"),
}


@pytest.mark.parametrize("form", RAGGED)
@pytest.mark.parametrize("datatype", list(ELEMENTS))
def test_ragged_nesting_is_refused(form: str, datatype: str) -> None:
    data = orjson.loads(form.format(*ELEMENTS[datatype]))
    with pytest.raises(InvalidInput, match="input 'obs': data is nested unevenly"):
        tensors.from_json("obs", datatype, [3], data)


@pytest.mark.parametrize("raw", [b"\x02", b"\x01\x00\xff", b"\x00\x80\x01"])
def test_bool_bytes_other_than_zero_and_one_are_refused(raw: bytes) -> None:
    with pytest.raises(InvalidInput, match="input 'b': BOOL bytes must be 0 or 1"):
        tensors.from_bytes("b", "BOOL", [len(raw)], raw)


def length_prefixed(*elements: bytes) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def test_bytes_tensors_hold_their_elements_as_bytes_in_every_form() -> None:
    strings = ["p-1", "pläyer", ""]
    expected = [s.encode() for s in strings]
    for values in (
        tensors.from_json("entities", "BYTES", [3], strings),
        tensors.from_json("entities", "BYTES", [3], expected),  # gRPC's bytes_contents
        tensors.from_bytes("entities", "BYTES", [3], length_prefixed(*expected)),
    ):
        assert values.dtype == object
        assert values.shape == (3,)
        assert values.tolist() == expected
    assert tensors.datatype_of(np.dtype(object)) == "BYTES"


@pytest.mark.parametrize(
    ("raw", "shape"),
    [
        (length_prefixed(b"ab", b"c")[:-1], [2]),  # the last element cut short
        (length_prefixed(b"ab", b"c") + b"\x00", [2]),  # a byte no element holds
        (length_prefixed(b"ab"), [2]),  # fewer elements than the shape
        (b"\x05\x00", [1]),  # a length cut short
    ],
)
def test_bytes_data_that_is_not_its_elements_is_refused(raw: bytes, shape: list[int]) -> None:
    with pytest.raises(InvalidInput, match=r"bytes of BYTES data are not \d elements of a 4-byte"):
        tensors.from_bytes("entities", "BYTES", shape, raw)


def test_bytes_tensors_are_bounded_and_flat_strings() -> None:
    with pytest.raises(InvalidInput, match="BYTES elements; a BYTES tensor carries ids"):
        tensors.from_bytes("entities", "BYTES", [10**6], b"")
    with pytest.raises(InvalidInput, match="element 1 is 7"):
        tensors.from_json("entities", "BYTES", [2], ["a", 7])
    with pytest.raises(InvalidInput, match="a flat list of 2 strings"):
        tensors.from_json("entities", "BYTES", [2], [["a", "b"]])
    with pytest.raises(InvalidInput, match="taken inline only"):
        tensors.dtype_of("BYTES", "entities")  # shared memory asks for a fixed size
