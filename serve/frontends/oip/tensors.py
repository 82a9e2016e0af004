"""Tensors of the Open Inference Protocol: datatypes, and data in and out of arrays.

The protocol names a tensor's element type with a datatype string (``FP32``, ``UINT8``,
``INT64``, ``BOOL`` ...) and gives its elements row-major: as JSON numbers (flat or nested),
as raw little-endian bytes (the binary tensor data extension over HTTP, ``raw_input_contents``
over gRPC), or as typed lists (gRPC ``InferTensorContents``). This module turns each form
into a numpy array of the declared datatype and shape, and arrays back into bytes or lists.
It checks only what a tensor says of itself: its datatype, its shape (at most
:data:`MAX_DIMS` axes, each a non-negative integer, the non-zero ones together at most
:data:`MAX_ELEMENTS`, all checked before any array is made, whichever transport carried
it), and that its data is exactly that shape's worth (JSON data nested to exactly the shape,
or flat); whether a tensor fits the model is ``serve.frontends.oip.signature``'s business.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from kernel.errors import NAME_CHARACTERS, InvalidInput, MalformedRequest, quoted

# Datatype -> little-endian numpy dtype. BF16 has no place in a policy's tensors; it is
# refused by name. BYTES (variable-length strings) carries ids, not observations: a model
# with a features view takes its entities as one (serve.stores.features).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_DATATYPES = {dtype: name for name, dtype in DTYPES.items()}
BYTES = "BYTES"  # its elements as bytes objects, in an array of dtype object
MAX_STRINGS = 4096  # elements of a BYTES tensor: ids of a call's rows, checked before reading
_LENGTH = 4  # a BYTES element's bytes follow their count, a little-endian uint32
MAX_DIMS = 8  # more axes than any observation has; refused before any arithmetic
# More elements than the largest message either transport carries (a protobuf message is
# below 2 GiB, and rlserve's bodies far smaller) could hold, even at one byte each: a shape
# whose non-zero dimensions multiply past it is refused, even when a zero makes it empty.
MAX_ELEMENTS = 2**31


def datatype_of(dtype: np.dtype | str) -> str:
    """The protocol's datatype for a numpy dtype (``float32`` -> ``FP32``)."""
    name = _DATATYPES.get(dtype) if isinstance(dtype, np.dtype) else None  # the common case
    if name is None and np.dtype(dtype).kind == "O":
        return BYTES
    if name is None:
        name = _DATATYPES.get(np.dtype(dtype).newbyteorder("<"))
    if name is None:
        raise ValueError(f"dtype {dtype} has no Open Inference Protocol datatype")
    return name


def dtype_of(datatype: str, name: str) -> np.dtype:
    """The numpy dtype of a tensor's declared datatype; InvalidInput for one we do not take."""
    dtype = DTYPES.get(datatype)
    if dtype is None and datatype == BYTES:
        raise InvalidInput(
            f"input {quoted(name)}: BYTES data has no fixed size, so it is taken inline only "
            "(JSON data, binary data or gRPC contents), not in shared memory"
        )
    if dtype is None:
        raise InvalidInput(
            f"input {quoted(name)}: datatype {quoted(datatype)} is not supported; use one of "
            f"{sorted(DTYPES)}"
        )
    return dtype


def element_count(shape: Sequence[int], name: str) -> int:
    """The elements a shape holds; MalformedRequest for a shape no tensor can have. Each
    dimension is checked before any is multiplied, so no shape costs more than its axes."""
    if len(shape) > MAX_DIMS or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape
    ):
        shown = list(shape) if len(shape) <= MAX_DIMS + 1 else f"of {len(shape):,} axes"
        raise MalformedRequest(
            f"input {quoted(name)}: shape {str(shown)[:200]} is not a tensor shape; give at "
            f"most {MAX_DIMS} non-negative integers"
        )
    spanned = 1  # the non-zero dimensions' product: what an empty tensor's strides span
    for d in shape:
        spanned *= max(d, 1)
        if spanned > MAX_ELEMENTS:
            raise MalformedRequest(
                f"input {quoted(name)}: shape {list(shape)} is not a tensor shape; its "
                f"non-zero dimensions hold more than {MAX_ELEMENTS:,} elements, more than "
                "any request can carry"
            )
    return 0 if 0 in shape else spanned


def from_bytes(
    name: str, datatype: str, shape: Sequence[int], raw: bytes | memoryview
) -> np.ndarray:
    """A tensor from its raw row-major little-endian bytes (no copy; BYTES: copied)."""
    if datatype == BYTES:
        return _strings_from_bytes(name, shape, raw)
    dtype = dtype_of(datatype, name)
    count = element_count(shape, name)
    if len(raw) != count * dtype.itemsize:
        raise InvalidInput(
            f"input {quoted(name)}: {len(raw)} bytes of data for shape {list(shape)} of "
            f"{datatype} needs {count * dtype.itemsize} ({count} elements of "
            f"{dtype.itemsize} bytes)"
        )
    if dtype.kind == "b":
        values = np.frombuffer(raw, dtype=np.uint8)
        if values.size and values.max() > 1:
            raise InvalidInput(f"input {quoted(name)}: BOOL bytes must be 0 or 1")
        return values.view(np.bool_).reshape(shape)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def from_json(
    name: str, datatype: str, shape: Sequence[int], data: Any, *, may_hold_booleans: bool = True
) -> np.ndarray:
    """A tensor from its JSON ``data``: its elements row-major, flat or nested.

    JSON booleans are data only for BOOL (numpy and ``array`` would take them as 1 and 0):
    a caller that knows its body holds no ``true``/``false`` (a search in C over the bytes)
    passes ``may_hold_booleans=False`` and skips looking for them."""
    if datatype == BYTES:
        return _strings_from_json(name, shape, data)
    dtype = dtype_of(datatype, name)
    count = element_count(shape, name)
    if not isinstance(data, list):
        raise InvalidInput(
            f"input {quoted(name)}: data must be a list of {count} {datatype} values, "
            f"got {type(data).__name__}"
        )
    if dtype.kind != "b" and may_hold_booleans and _holds_boolean(data):
        raise InvalidInput(
            f"input {quoted(name)}: {datatype} data must be numbers, not true or false"
        )
    values = _flat_array(data, dtype) if data and type(data[0]) is not list else None
    if values is None:
        values = _nested_array(name, datatype, data, dtype)
    if values.ndim > 1 and values.shape != tuple(shape):
        raise InvalidInput(
            f"input {quoted(name)}: data nested as {list(values.shape)} for shape "
            f"{list(shape)}; nest it exactly as the shape, or give its {count} values flat "
            "(row-major)"
        )
    if values.size != count:
        raise InvalidInput(
            f"input {quoted(name)}: {values.size} values of data for shape {list(shape)}, "
            f"which holds {count}"
        )
    return values.reshape(shape)


def _string_count(name: str, shape: Sequence[int]) -> int:
    count = element_count(shape, name)
    if count > MAX_STRINGS:
        raise InvalidInput(
            f"input {quoted(name)}: shape {list(shape)} holds {count:,} BYTES elements; a BYTES "
            f"tensor carries ids of a call's rows, at most {MAX_STRINGS:,}"
        )
    return count


def _strings_from_json(name: str, shape: Sequence[int], data: Any) -> np.ndarray:
    """A BYTES tensor's JSON data: strings (or, from gRPC contents, bytes), flat."""
    count = _string_count(name, shape)
    if not isinstance(data, list) or len(data) != count:
        raise InvalidInput(
            f"input {quoted(name)}: BYTES data must be a flat list of {count} strings for "
            f"shape {list(shape)}"
        )
    values = np.empty(count, dtype=object)
    for index, item in enumerate(data):
        if isinstance(item, str):
            item = item.encode()
        elif not isinstance(item, bytes):
            raise InvalidInput(
                f"input {quoted(name)}: BYTES data must be strings; element {index} is "
                f"{_shown(item)}"
            )
        values[index] = item
    return values.reshape(shape)


def _strings_from_bytes(name: str, shape: Sequence[int], raw: bytes | memoryview) -> np.ndarray:
    """A BYTES tensor's raw data: each element's byte count (a little-endian uint32), then
    its bytes, row-major; every byte accounted for."""
    count = _string_count(name, shape)
    view = memoryview(raw).cast("B")
    values = np.empty(count, dtype=object)
    at = 0
    for index in range(count):
        if at + _LENGTH > len(view):
            break
        size = int.from_bytes(view[at : at + _LENGTH], "little")
        if at + _LENGTH + size > len(view):
            break
        values[index] = bytes(view[at + _LENGTH : at + _LENGTH + size])
        at += _LENGTH + size
    else:
        if at == len(view):
            return values.reshape(shape)
    raise InvalidInput(
        f"input {quoted(name)}: {len(view)} bytes of BYTES data are not {count} elements of "
        "a 4-byte little-endian length and that many bytes each"
    )


def _shown(value: Any) -> str:
    return quoted(value) if isinstance(value, str) else repr(value)[:NAME_CHARACTERS]


def _flat_array(data: list[Any], dtype: np.dtype) -> np.ndarray | None:
    """The common cases, converted in C by a constructor that refuses anything else: FP32
    (``array`` refuses non-numbers) and UINT8 (``bytes`` refuses anything but integers
    0..255)."""
    try:
        if dtype == np.float32:
            return np.frombuffer(array.array("f", data), dtype=np.float32)
        if dtype == np.uint8:
            return np.frombuffer(bytes(data), dtype=np.uint8)
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _nested_array(name: str, datatype: str, data: list[Any], dtype: np.dtype) -> np.ndarray:
    """Any form of JSON data, converted by numpy and then checked: booleans only for BOOL,
    integers for integer datatypes, numbers for floating ones, each within the datatype's
    range."""
    try:
        values = np.asarray(data)
    except ValueError:  # ragged nesting
        raise InvalidInput(
            f"input {quoted(name)}: data is nested unevenly; give the elements row-major, flat "
            "or nested to the tensor's shape"
        ) from None
    kind = values.dtype.kind
    if dtype.kind in "iu" and kind in "fO" and values.size:
        exact = _python_integers(name, datatype, data, dtype)
        if exact is not None:
            return exact.reshape(values.shape)
    if dtype.kind == "b":
        fits = kind == "b" or values.size == 0
    elif dtype.kind in "iu":
        fits = kind in "iu" or values.size == 0
    else:
        fits = kind in "iuf" or values.size == 0
    if not fits:
        wanted = {"b": "true or false", "i": "integers", "u": "integers"}.get(dtype.kind, "numbers")
        raise InvalidInput(
            f"input {quoted(name)}: {datatype} data must be {wanted}; got {_sample(values)}"
        )
    if dtype.kind in "iu" and values.size:
        info = np.iinfo(dtype)
        if kind not in "iu" or values.min() < info.min or values.max() > info.max:
            raise InvalidInput(
                f"input {quoted(name)}: {datatype} values must lie in {info.min}..{info.max}; "
                f"got {values.min()}..{values.max()}"
            )
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def _python_integers(
    name: str, datatype: str, data: list[Any], dtype: np.dtype
) -> np.ndarray | None:
    """Integers numpy could not hold in one integer dtype (a mix past int64 and below 0, or
    past uint64), judged one by one; None when they are not all integers."""
    items = np.asarray(data, dtype=object).reshape(-1).tolist()
    if not all(type(v) is int for v in items):
        return None
    info = np.iinfo(dtype)
    low, high = min(items), max(items)
    if low < info.min or high > info.max:
        raise InvalidInput(
            f"input {quoted(name)}: {datatype} values must lie in {info.min}..{info.max}; "
            f"got {low}..{high}"
        )
    return np.array(items, dtype=dtype)


def _holds_boolean(data: list[Any]) -> bool:
    """Whether a JSON true or false sits anywhere in nested lists (a walk in C per list)."""
    kinds = set(map(type, data))
    if bool in kinds:
        return True
    return list in kinds and any(_holds_boolean(v) for v in data if type(v) is list)


def _sample(values: np.ndarray) -> str:
    """The first value that is not a number (a string, null, a boolean), as written."""
    flat = values.reshape(-1).tolist()
    value = next(
        (v for v in flat if v is None or isinstance(v, bool) or not isinstance(v, int | float)),
        flat[0],
    )
    return _shown(value)


def to_bytes(values: np.ndarray) -> bytes:
    """A tensor's raw row-major little-endian bytes."""
    return np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes()


def to_json(values: np.ndarray) -> list[Any]:
    """A tensor's elements, flat and row-major, as JSON values."""
    flat: list[Any] = values.reshape(-1).tolist()
    return flat
