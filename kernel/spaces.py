"""Observation and action spaces in gymnasium's terms, without importing gymnasium.

All space handling of rlserve lives in this one module:

- the JSON form stored in the policy contract (``Box``, ``Discrete``, ``MultiDiscrete``,
  ``MultiBinary``, ``Dict``); infinite bounds are written as the strings ``"inf"``/``"-inf"``;
- conversion from gymnasium spaces (:func:`from_gymnasium`);
- the tensor each observation leaf becomes (:func:`input_dtype`);
- sampling observations for parity checks (:func:`sample`);
- turning request JSON into validated numpy batches (:func:`parse_observations`), which
  checks shape, dtype, finiteness and bounds and names the field that is wrong; what happens
  to values outside a Box's declared bounds is an :class:`ObservationBounds` policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kernel.errors import InvalidInput
from kernel.json_shown import json_shown

# A bound as stored in JSON: a number, "inf"/"-inf", or a nested list of those.
JsonBound = float | int | str | list[Any]

_FLOAT_KINDS = ("f",)
_INT_KINDS = ("i", "u", "b")


class ObservationBounds(StrEnum):
    """What becomes of an observation value outside its Box's declared bounds (a model's
    ``observation_bounds`` setting).

    Only a Box's declared ``low``/``high`` are meant. Shape, dtype (float32's range;
    integers 0..255 for uint8) and finiteness are checked in every mode, and so are the
    indices of Discrete, MultiDiscrete and MultiBinary spaces: a wrong index is not a
    reading slightly off, it is invalid input.
    """

    REJECT = "reject"  # refuse the request (422), naming the value, where, and the bounds
    CLIP = "clip"  # clip each value into [low, high] before the model runs
    ALLOW = "allow"  # serve it as given, as Stable-Baselines3 does (RLlib: optional check)


def _encode_bound(values: np.ndarray) -> JsonBound:
    """A bound array as JSON: a scalar when uniform, else a nested list; infinities as text."""
    flat = values.astype(np.float64)
    if flat.size > 0 and np.all(flat == flat.flat[0]):
        return _encode_scalar(float(flat.flat[0]))
    return _encode_nested(flat.tolist())


def _encode_scalar(x: float) -> float | str:
    if np.isposinf(x):
        return "inf"
    if np.isneginf(x):
        return "-inf"
    return x


def _encode_nested(x: Any) -> Any:
    return [_encode_nested(v) for v in x] if isinstance(x, list) else _encode_scalar(x)


def _decode_nested(x: Any) -> Any:
    if isinstance(x, list):
        return [_decode_nested(v) for v in x]
    return float(x)  # float("inf") and float("-inf") read the text form


class _Space(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Box(_Space):
    type: Literal["Box"] = "Box"
    shape: tuple[int, ...]
    dtype: str = "float32"
    low: JsonBound = "-inf"
    high: JsonBound = "inf"

    @classmethod
    def from_arrays(cls, low: np.ndarray, high: np.ndarray, dtype: str) -> Box:
        return cls(
            shape=tuple(int(d) for d in low.shape),
            dtype=str(np.dtype(dtype)),
            low=_encode_bound(low),
            high=_encode_bound(high),
        )

    @cached_property
    def low_array(self) -> np.ndarray:
        return np.broadcast_to(np.asarray(_decode_nested(self.low)), self.shape)

    @cached_property
    def high_array(self) -> np.ndarray:
        return np.broadcast_to(np.asarray(_decode_nested(self.high)), self.shape)

    @cached_property
    def finite_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 bounds with infinities replaced by the largest finite float32, so that a
        single comparison also rejects inf and NaN."""
        big = np.finfo(np.float32).max
        low = np.maximum(self.low_array, -big).astype(np.float32)
        high = np.minimum(self.high_array, big).astype(np.float32)
        return low, high


class Discrete(_Space):
    type: Literal["Discrete"] = "Discrete"
    n: int = Field(gt=0)
    start: int = 0


class MultiDiscrete(_Space):
    type: Literal["MultiDiscrete"] = "MultiDiscrete"
    nvec: tuple[int, ...]
    start: tuple[int, ...] | None = None

    @property
    def start_array(self) -> np.ndarray:
        return np.asarray(self.start if self.start is not None else [0] * len(self.nvec))


class MultiBinary(_Space):
    type: Literal["MultiBinary"] = "MultiBinary"
    n: int = Field(gt=0)


LeafSpace = Annotated[Box | Discrete | MultiDiscrete | MultiBinary, Field(discriminator="type")]


class Dict(_Space):
    type: Literal["Dict"] = "Dict"
    spaces: dict[str, LeafSpace]


Space = Annotated[Box | Discrete | MultiDiscrete | MultiBinary | Dict, Field(discriminator="type")]
Leaf = Box | Discrete | MultiDiscrete | MultiBinary


def leaves(
    space: Box | Discrete | MultiDiscrete | MultiBinary | Dict,
) -> list[tuple[str | None, Leaf]]:
    """The leaf spaces in order; ``None`` is the key of a space that is not a Dict."""
    if isinstance(space, Dict):
        return list(space.spaces.items())
    return [(None, space)]


def leaf_shape(space: Leaf) -> tuple[int, ...]:
    """The shape of one observation or action of this leaf, without the batch axis."""
    if isinstance(space, Box):
        return space.shape
    if isinstance(space, Discrete):
        return ()
    if isinstance(space, MultiDiscrete):
        return (len(space.nvec),)
    return (space.n,)


def input_dtype(space: Leaf) -> np.dtype:
    """The dtype of the graph input that carries this leaf.

    uint8 images stay uint8 (a quarter of the bytes); discrete values are int64; everything
    else is float32, which is what the policies compute in.
    """
    if isinstance(space, Box):
        return np.dtype(np.uint8) if space.dtype == "uint8" else np.dtype(np.float32)
    if isinstance(space, Discrete | MultiDiscrete):
        return np.dtype(np.int64)
    return np.dtype(np.float32)


# --------------------------------------------------------------------------- gymnasium


def from_gymnasium(space: Any) -> Box | Discrete | MultiDiscrete | MultiBinary | Dict:
    """Describe a gymnasium space; raises InvalidInput for kinds a policy contract cannot hold."""
    kind = type(space).__name__
    if kind == "Box":
        return Box.from_arrays(np.asarray(space.low), np.asarray(space.high), str(space.dtype))
    if kind == "Discrete":
        return Discrete(n=int(space.n), start=int(space.start))
    if kind == "MultiDiscrete":
        nvec = np.asarray(space.nvec)
        if nvec.ndim != 1:
            raise InvalidInput(f"MultiDiscrete spaces must be 1-D; got nvec of shape {nvec.shape}")
        start = np.asarray(getattr(space, "start", np.zeros_like(nvec)))
        return MultiDiscrete(
            nvec=tuple(int(n) for n in nvec),
            start=None if not start.any() else tuple(int(s) for s in start),
        )
    if kind == "MultiBinary":
        n = space.n if isinstance(space.n, int) else int(np.prod(space.n))
        if not isinstance(space.n, int) and len(space.n) != 1:
            raise InvalidInput(f"MultiBinary spaces must be 1-D; got shape {space.n}")
        return MultiBinary(n=int(n))
    if kind == "Dict":
        children = {str(k): from_gymnasium(v) for k, v in space.spaces.items()}
        nested = [k for k, v in children.items() if isinstance(v, Dict)]
        if nested:
            raise InvalidInput(
                f"nested Dict spaces are not supported (keys {nested}); flatten them"
            )
        return Dict(spaces=children)  # type: ignore[arg-type]
    raise InvalidInput(
        f"unsupported space {kind}; supported: Box, Discrete, MultiDiscrete, MultiBinary, "
        "and a Dict of these"
    )


# --------------------------------------------------------------------------- sampling

_WIDE = 1e6  # wider ranges than this are sampled around zero rather than uniformly


def sample(space: Leaf, rng: np.random.Generator, n: int) -> np.ndarray:
    """n observations of a leaf, in its input dtype, for parity checks.

    Finite, narrow Box dimensions are sampled uniformly; unbounded or very wide ones from a
    standard normal clipped to the bounds (uniform over 1e38 gives only overflow).
    """
    shape = (n, *leaf_shape(space))
    if isinstance(space, Box):
        if space.dtype == "uint8":
            low = np.maximum(space.low_array, 0).astype(np.int64)
            high = np.minimum(space.high_array, 255).astype(np.int64)
            return rng.integers(low, high + 1, size=shape).astype(np.uint8)
        low, high = space.low_array.astype(np.float64), space.high_array.astype(np.float64)
        narrow = np.isfinite(low) & np.isfinite(high) & (high - low <= _WIDE)
        uniform = rng.uniform(np.where(narrow, low, 0.0), np.where(narrow, high, 1.0), size=shape)
        normal = np.clip(rng.standard_normal(size=shape), low, high)
        return np.where(narrow, uniform, normal).astype(input_dtype(space))
    if isinstance(space, Discrete):
        return rng.integers(space.start, space.start + space.n, size=shape)
    if isinstance(space, MultiDiscrete):
        start = space.start_array
        return rng.integers(start, start + np.asarray(space.nvec), size=shape)
    return rng.integers(0, 2, size=shape).astype(np.float32)


# --------------------------------------------------------------------------- requests


@dataclass(slots=True)
class ObservationBatch:
    """Validated observations: one array per leaf key, all with the same number of rows.

    Built once per request on the request path, so slots and no frozen ``__setattr__``
    (half the cost of a frozen dataclass); treat it as read-only."""

    arrays: dict[str | None, np.ndarray]
    rows: int
    single: bool  # the request held one observation, not a list; answer in kind
    out_of_bounds: int = 0  # rows with a value outside a Box's declared bounds, as given


def parse_observations(
    space: Box | Discrete | MultiDiscrete | MultiBinary | Dict,
    value: Any,
    field: str = "observations",
    *,
    bounds: ObservationBounds = ObservationBounds.REJECT,
) -> ObservationBatch:
    """Validate request data against a space and turn it into batched numpy arrays.

    A single observation or a list of them is accepted; for a Dict space, either a mapping
    of key to value(s) or a list of such mappings. ``bounds`` says what becomes of values
    outside a Box's declared bounds (refused by default: actions, parity observations).
    """
    if not isinstance(space, Dict):
        return _bounded({None: _parse_leaf(space, value, field, bounds)}, bounds)
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        value = {k: [v.get(k) for v in value] for k in space.spaces}
    if not isinstance(value, Mapping):
        raise InvalidInput(
            f"{field}: expected an object with keys {sorted(space.spaces)} "
            f"(or a list of them), got {type(value).__name__}"
        )
    unknown = sorted(set(value) - set(space.spaces))
    missing = sorted(set(space.spaces) - set(value))
    if unknown or missing:
        raise InvalidInput(
            f"{field}: keys must be exactly {sorted(space.spaces)}; "
            f"missing {missing}, unexpected {unknown}"
        )
    parsed: dict[str | None, _Leaf] = {
        k: _parse_leaf(s, value[k], f"{field}.{k}", bounds) for k, s in space.spaces.items()
    }
    forms = {leaf.single for leaf in parsed.values()}
    rows = {len(leaf.array) for leaf in parsed.values()}
    if len(forms) > 1 or len(rows) > 1:
        sizes = {k: (1 if leaf.single else len(leaf.array)) for k, leaf in parsed.items()}
        raise InvalidInput(f"{field}: every key needs the same number of observations; got {sizes}")
    return _bounded(parsed, bounds)


class _Leaf(NamedTuple):
    """One leaf's rows, checked, in its input dtype (clipped in clip mode)."""

    array: np.ndarray
    single: bool
    outside: np.ndarray | None = None  # [rows] bool: a value outside the Box's bounds
    problem: str = ""  # reject mode: the first value outside, named


def _bounded(parsed: Mapping[str | None, _Leaf], bounds: ObservationBounds) -> ObservationBatch:
    """The leaves as one batch, refused in reject mode when a row is outside the bounds."""
    arrays = {k: leaf.array for k, leaf in parsed.items()}
    first = next(iter(parsed.values()))
    outside = [leaf.outside for leaf in parsed.values() if leaf.outside is not None]
    if not outside:  # the common case
        return ObservationBatch(arrays, rows=len(first.array), single=first.single)
    rows = int(np.logical_or.reduce(outside).sum())
    if bounds is ObservationBounds.REJECT:
        problem = next(leaf.problem for leaf in parsed.values() if leaf.problem)
        raise InvalidInput(problem, out_of_bounds=rows)
    return ObservationBatch(arrays, rows=len(first.array), single=first.single, out_of_bounds=rows)


def _parse_leaf(space: Leaf, value: Any, field: str, bounds: ObservationBounds) -> _Leaf:
    expected = leaf_shape(space)
    array = _as_numeric_array(value, field)
    if array.shape == expected:
        single = True
        array = array[np.newaxis]
    elif array.ndim == len(expected) + 1 and array.shape[1:] == expected and len(array) > 0:
        single = False
    else:
        raise InvalidInput(
            f"{field}: expected shape {_shape_text(expected)} for one observation or "
            f"{_shape_text(('N', *expected))} for N of them; got {_shape_text(array.shape)}"
        )
    if isinstance(space, Box):
        if space.dtype != "uint8":
            return _float_box(space, array, field, bounds, single=single)
        return _uint8_box(space, array, field, bounds, single=single)
    _check_values(space, array, field)
    return _Leaf(array.astype(input_dtype(space), copy=False), single)


def _float_box(
    space: Box, array: np.ndarray, field: str, bounds: ObservationBounds, *, single: bool
) -> _Leaf:
    """The common case, in three array operations: finite and within bounds, as float32.

    Bounds are compared in float32, the precision the policy computes in (a float64 0.4188
    may round onto a float32 bound). Only a batch that fails pays for the rest: non-finite
    values and values float32 cannot hold are refused in every mode; values outside the
    bounds are named (reject), clipped (clip) or kept (allow), and their rows counted.
    """
    with np.errstate(over="ignore"):
        cast = array.astype(np.float32, copy=False)
    low, high = space.finite_bounds
    fits = (cast >= low) & (cast <= high)
    if np.all(fits):
        return _Leaf(cast, single)
    _check_finite(array, field)
    huge = ~np.isfinite(cast)
    if np.any(huge):
        raise InvalidInput(f"{field}: value {_first_bad(huge, array)} does not fit in float32")
    outside = ~fits
    if bounds is ObservationBounds.CLIP:
        cast = np.clip(cast, low, high)
    # Bounds in the space's dtype, so they print as declared (0.418, not 0.41800001263).
    declared = space.low_array.astype(space.dtype), space.high_array.astype(space.dtype)
    return _outside(cast, single, outside, bounds, _problem(field, outside, array, *declared))


def _uint8_box(
    space: Box, array: np.ndarray, field: str, bounds: ObservationBounds, *, single: bool
) -> _Leaf:
    """Integers 0..255 in every mode; the declared bounds as ``bounds`` says."""
    _check_finite(array, field)
    if array.dtype.kind in _FLOAT_KINDS and not np.all(array == np.round(array)):
        bad = _first_bad(array != np.round(array), array)
        raise InvalidInput(f"{field}: expected integers 0..255 for a uint8 Box; found {bad}")
    low, high = space.low_array, space.high_array
    outside = (array < low) | (array > high)
    problem = _problem(field, outside, array, low, high) if np.any(outside) else ""
    if problem and bounds is ObservationBounds.REJECT:  # as refused before bounds were a policy
        return _outside(array, single, outside, bounds, problem)
    beyond = (array < 0) | (array > 255)
    if np.any(beyond):
        raise InvalidInput(
            f"{field}: value {_first_bad(beyond, array)} does not fit in uint8; "
            "expected integers 0..255"
        )
    if not problem:
        return _Leaf(array.astype(np.uint8, copy=False), single)
    if bounds is ObservationBounds.CLIP:
        array = np.clip(array, low, high)
    return _outside(array.astype(np.uint8, copy=False), single, outside, bounds, problem)


def _outside(
    array: np.ndarray, single: bool, outside: np.ndarray, bounds: ObservationBounds, problem: str
) -> _Leaf:
    rows = np.asarray(outside.reshape(len(outside), -1).any(axis=1))
    return _Leaf(array, single, rows, problem if bounds is ObservationBounds.REJECT else "")


def _problem(
    field: str, outside: np.ndarray, array: np.ndarray, low: np.ndarray, high: np.ndarray
) -> str:
    """The first value outside the bounds, where it is, and the bounds."""
    index = tuple(int(i) for i in np.argwhere(outside)[0])
    lo, hi = np.broadcast_to(low, array.shape)[index], np.broadcast_to(high, array.shape)[index]
    return (
        f"{field}: value {array[index]!s} at index {list(index)} is outside the space's "
        f"bounds [{lo!s}, {hi!s}]"
    )


def _as_numeric_array(value: Any, field: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged nesting
        raise InvalidInput(f"{field}: lists must be rectangular ({exc})") from None
    if array.dtype.kind not in _FLOAT_KINDS + _INT_KINDS:
        example = _first_non_number(value)
        raise InvalidInput(f"{field}: expected numbers, got {json_shown(example)}")
    return array


def _check_finite(array: np.ndarray, field: str) -> None:
    if array.dtype.kind in _FLOAT_KINDS and not np.all(np.isfinite(array)):
        raise InvalidInput(
            f"{field}: values must be finite; found {_first_bad(~np.isfinite(array), array)}"
        )


def _check_values(
    space: Discrete | MultiDiscrete | MultiBinary, array: np.ndarray, field: str
) -> None:
    """A discrete space's values: integers within its range, whatever the bounds policy."""
    _check_finite(array, field)
    if array.dtype.kind in _FLOAT_KINDS and not np.all(array == np.round(array)):
        bad = _first_bad(array != np.round(array), array)
        raise InvalidInput(f"{field}: expected integers for a {space.type} space; found {bad}")
    if isinstance(space, Discrete):
        low, high = np.asarray(space.start), np.asarray(space.start + space.n - 1)
    elif isinstance(space, MultiDiscrete):
        low, high = space.start_array, space.start_array + np.asarray(space.nvec) - 1
    else:
        low, high = np.asarray(0), np.asarray(1)
    outside = (array < low) | (array > high)
    if np.any(outside):
        raise InvalidInput(_problem(field, outside, array, low, high))


def _first_non_number(value: Any) -> Any:
    if isinstance(value, list):
        found = (_first_non_number(v) for v in value)
        return next((v for v in found if v is not None), None)
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return None if is_number or isinstance(value, bool) else value


def _first_bad(mask: np.ndarray, array: np.ndarray) -> str:
    index = tuple(int(i) for i in np.argwhere(mask)[0])
    return f"{array[index]!s} at index {list(index)}"


def _shape_text(shape: tuple[int | str, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
