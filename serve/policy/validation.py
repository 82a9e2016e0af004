"""Request validation compiled once per loaded version, from its policy contract.

:class:`ObservationValidator` turns the observations of a request (nested lists from JSON,
or arrays) into the graph's feeds with as few conversions as the common cases allow:

- a flat float row (one observation of a 1-D Box): one C-level conversion to float32
  (``array.array``, which refuses anything but numbers) and one bounds check;
- float rows in general: one ``numpy`` conversion, a dtype check, one bounds check;
- uint8 images: the nesting is checked level by level and each innermost list becomes
  bytes in C (``bytes`` refuses anything but integers 0..255).

Whatever a fast path does not accept goes to ``kernel.spaces.parse_observations``, the
general path, which accepts the same requests and names exactly what is wrong with the
others. A fast path never accepts a request the general path would refuse, and gives the
same arrays (and count of rows outside the bounds) for those it accepts.

Bounds are a model's ``observation_bounds`` policy (``kernel.spaces.ObservationBounds``). An
in-bounds request pays one comparison against the bounds, as before bounds were a policy;
only a request that fails it pays for telling a non-finite value from one outside the
bounds, counting its rows and clipping them (``clip``); ``reject`` leaves it to the
general path, which names the value.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kernel.contract import PolicyContract, TensorRole
from kernel.errors import InvalidInput
from kernel.json_shown import json_shown
from kernel.spaces import Box, Dict, ObservationBatch, ObservationBounds, parse_observations
from serve.types import OutputKind, PredictOptions

FastPath = Callable[[Any], ObservationBatch | None]


class ObservationValidator:
    """A contract's observations, checked and converted to feeds, with values outside a
    Box's bounds refused, clipped or allowed as ``bounds`` says."""

    def __init__(self, contract: PolicyContract, *, bounds: ObservationBounds) -> None:
        self.space = contract.observation_space
        self.bounds = bounds
        self.input_names = {
            spec.key: spec.name for spec in contract.inputs if spec.role is TensorRole.OBSERVATION
        }
        self._fast = _fast_path(self.space, bounds)

    def __call__(self, value: Any) -> ObservationBatch:
        if self._fast is not None:
            batch = self._fast(value)
            if batch is not None:
                return batch
        return parse_observations(self.space, value, bounds=self.bounds)

    def feeds(self, batch: ObservationBatch) -> dict[str, np.ndarray]:
        """Graph input name -> rows."""
        return {self.input_names[key]: rows for key, rows in batch.arrays.items()}


def _fast_path(space: Any, bounds: ObservationBounds) -> FastPath | None:
    if isinstance(space, Dict) or not isinstance(space, Box):
        return None  # discrete spaces and dicts: the general path is already short
    if space.dtype == "uint8":
        return _Uint8Images(space, bounds)
    return _FloatRows(space, bounds)


def _outside_rows(outside: np.ndarray) -> int:
    """How many rows (the first axis) hold a value outside the bounds."""
    return int(outside.reshape(len(outside), -1).any(axis=1).sum())


class _FloatRows:
    def __init__(self, space: Box, bounds: ObservationBounds) -> None:
        self.shape = space.shape
        self.flat = len(space.shape) == 1
        self.width = space.shape[0] if self.flat else 0
        self.low, self.high = space.finite_bounds
        self.unbounded = bool(
            np.all(np.isinf(space.low_array)) and np.all(np.isinf(space.high_array))
        )
        self.bounds = bounds

    def __call__(self, value: Any) -> ObservationBatch | None:
        if isinstance(value, np.ndarray):
            return self._rows(value) if value.dtype.kind in "fiub" else None
        if not isinstance(value, list) or not value:
            return None
        if self.flat and not isinstance(value[0], list):
            try:
                rows = np.frombuffer(array.array("f", value), dtype=np.float32)
            except TypeError:
                return None
            if len(rows) != self.width:
                return None
            return self._checked(rows.reshape(1, self.width), single=True)
        try:
            converted = np.asarray(value)
        except ValueError:  # ragged
            return None
        return self._rows(converted) if converted.dtype.kind in "fiub" else None

    def _rows(self, array: np.ndarray) -> ObservationBatch | None:
        """Numbers already in an array (numpy did the parsing): cast, shape, bounds."""
        if array.dtype == np.float32:  # binary tensors: no copy
            rows = array
        else:
            with np.errstate(over="ignore"):
                rows = array.astype(np.float32)
        single = rows.shape == self.shape
        if single:
            rows = rows[np.newaxis]
        elif rows.ndim != len(self.shape) + 1 or rows.shape[1:] != self.shape or not len(rows):
            return None
        return self._checked(rows, single=single)

    def _checked(self, rows: np.ndarray, *, single: bool) -> ObservationBatch | None:
        """One comparison for the common case (the finite bounds also refuse inf and NaN)."""
        if self.unbounded:
            if not np.isfinite(rows).all():
                return None
            return ObservationBatch({None: rows}, rows=len(rows), single=single)
        fits = (rows >= self.low) & (rows <= self.high)
        if fits.all():
            return ObservationBatch({None: rows}, rows=len(rows), single=single)
        if self.bounds is ObservationBounds.REJECT or not np.isfinite(rows).all():
            return None  # the general path names the value
        if self.bounds is ObservationBounds.CLIP:
            rows = np.clip(rows, self.low, self.high)
        outside = _outside_rows(~fits)
        return ObservationBatch({None: rows}, rows=len(rows), single=single, out_of_bounds=outside)


class _Uint8Images:
    def __init__(self, space: Box, bounds: ObservationBounds) -> None:
        self.shape = space.shape
        low, high = space.low_array, space.high_array
        self.full_range = bool(np.all(low <= 0) and np.all(high >= 255))
        self.low, self.high = low.astype(np.int64), high.astype(np.int64)
        self.bounds = bounds

    def __call__(self, value: Any) -> ObservationBatch | None:
        if isinstance(value, np.ndarray):
            return self._array(value)
        depth = _depth(value, len(self.shape) + 1)
        if depth == len(self.shape):
            single, dims = True, self.shape
        elif depth == len(self.shape) + 1 and value:
            single, dims = False, (len(value), *self.shape)
        else:
            return None
        innermost = _innermost_lists(value, dims)
        if innermost is None:
            return None
        try:
            data = b"".join(map(bytes, innermost))
        except (TypeError, ValueError):  # not integers, or outside 0..255
            return None
        rows = np.frombuffer(data, dtype=np.uint8).reshape(dims)
        return self._checked(rows[np.newaxis] if single else rows, single=single)

    def _array(self, array: np.ndarray) -> ObservationBatch | None:
        """Integers already in an array: within 0..255, shaped as one image or a batch."""
        if array.dtype.kind not in "iu" or not len(array):
            return None
        single = array.shape == self.shape
        if not single and array.shape[1:] != self.shape:
            return None
        if array.dtype == np.uint8:  # binary tensors: already what the graph takes
            rows = array
        elif array.min() < 0 or array.max() > 255:
            return None
        else:
            rows = array.astype(np.uint8)
        return self._checked(rows[np.newaxis] if single else rows, single=single)

    def _checked(self, rows: np.ndarray, *, single: bool) -> ObservationBatch | None:
        if self.full_range:
            return ObservationBatch({None: rows}, rows=len(rows), single=single)
        fits = (rows >= self.low) & (rows <= self.high)
        if fits.all():
            return ObservationBatch({None: rows}, rows=len(rows), single=single)
        if self.bounds is ObservationBounds.REJECT:
            return None  # the general path names the value
        if self.bounds is ObservationBounds.CLIP:
            rows = np.clip(rows, self.low, self.high).astype(np.uint8)
        outside = _outside_rows(~fits)
        return ObservationBatch({None: rows}, rows=len(rows), single=single, out_of_bounds=outside)


def _depth(value: Any, limit: int) -> int:
    """How deep lists nest along the first elements (at most ``limit``)."""
    depth = 0
    while isinstance(value, list) and depth <= limit:
        depth += 1
        if not value:
            break
        value = value[0]
    return depth


def _innermost_lists(value: list[Any], dims: tuple[int, ...]) -> list[list[Any]] | None:
    """The innermost lists of a nesting whose every level has exactly the lengths ``dims``."""
    level: list[Any] = [value]
    for size in dims[:-1]:
        if any(type(item) is not list or len(item) != size for item in level):
            return None
        level = [child for item in level for child in item]
    last = dims[-1]
    if any(type(item) is not list or len(item) != last for item in level):
        return None
    return level


# --------------------------------------------------------------------------- options

DEFAULT_OPTIONS = PredictOptions()
_OUTPUT_NAMES = [k.value for k in OutputKind]
_OUTPUT_SETS: dict[tuple[str, ...], frozenset[OutputKind]] = {}
_SHARED_OPTIONS: dict[tuple[bool, frozenset[OutputKind]], PredictOptions] = {}


def predict_options(parameters: Mapping[str, Any]) -> PredictOptions:
    """A request's parameters, checked. Requests without a seed and with equal parameters
    share one options object (the policy heads then treat their batch as a whole)."""
    if not parameters:
        return DEFAULT_OPTIONS
    deterministic = parameters.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise InvalidInput(
            f"deterministic: expected true or false, got {json_shown(deterministic)}"
        )
    seed = parameters.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise InvalidInput(f"seed: expected a non-negative integer, got {json_shown(seed)}")
    outputs = _outputs(parameters.get("outputs"))
    if seed is not None:
        return PredictOptions(deterministic, seed, outputs)
    key = (deterministic, outputs)
    shared = _SHARED_OPTIONS.get(key)
    if shared is None:  # at most 2 x the output sets _outputs keeps
        shared = _SHARED_OPTIONS[key] = PredictOptions(deterministic, None, outputs)
    return shared


def _outputs(given: Any) -> frozenset[OutputKind]:
    if given is None:
        return DEFAULT_OPTIONS.outputs
    key = tuple(given) if isinstance(given, list) else None
    known = _OUTPUT_SETS.get(key) if key is not None and _hashable(key) else None
    if known is not None:
        return known
    if not isinstance(given, list) or not given or any(o not in _OUTPUT_NAMES for o in given):
        raise InvalidInput(
            f"outputs: expected a non-empty list drawn from {_OUTPUT_NAMES}, got "
            f"{json_shown(given)}"
        )
    chosen = frozenset(OutputKind(o) for o in given)
    if len(_OUTPUT_SETS) < 64:  # every valid combination fits; nothing else is stored
        _OUTPUT_SETS[tuple(given)] = chosen
    return chosen


def _hashable(key: tuple[Any, ...]) -> bool:
    return all(isinstance(item, str) for item in key)
