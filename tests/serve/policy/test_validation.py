"""Compiled observation validation: the fast paths agree with the general path, and every
request they do not take gets the general path's answer, errors included."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernel.errors import InvalidInput
from kernel.spaces import ObservationBatch, ObservationBounds, parse_observations
from serve.policy.validation import DEFAULT_OPTIONS, ObservationValidator, predict_options
from serve.types import OutputKind
from tests.serve.policy.contracts import contract

DISCRETE = {"type": "Discrete", "n": 2}
VECTOR = {"type": "Box", "shape": [5], "dtype": "float32", "low": "-inf", "high": "inf"}
BOUNDED = {"type": "Box", "shape": [3], "dtype": "float32", "low": -1.0, "high": 1.0}
MATRIX = {"type": "Box", "shape": [2, 3], "dtype": "float32", "low": -2.0, "high": 2.0}
IMAGE = {"type": "Box", "shape": [2, 3, 4], "dtype": "uint8", "low": 0, "high": 255}
DIMMED = {"type": "Box", "shape": [2, 2], "dtype": "uint8", "low": 0, "high": 100}


def validator(
    space: dict[str, Any], bounds: ObservationBounds = ObservationBounds.REJECT
) -> ObservationValidator:
    return ObservationValidator(contract(space, DISCRETE), bounds=bounds)


def same_as_general(
    space: dict[str, Any], value: Any, bounds: ObservationBounds = ObservationBounds.REJECT
) -> ObservationBatch:
    """The compiled validator gives exactly what the general path gives."""
    checked = validator(space, bounds)
    assert checked._fast is not None
    fast = checked._fast(value)  # the fast path alone
    assert fast is not None, "the fast path should take this request"
    general = parse_observations(checked.space, value, bounds=bounds)
    assert (fast.rows, fast.single) == (general.rows, general.single)
    assert fast.out_of_bounds == general.out_of_bounds
    np.testing.assert_array_equal(fast.arrays[None], general.arrays[None])
    assert fast.arrays[None].dtype == general.arrays[None].dtype
    return fast


@pytest.mark.parametrize(
    ("space", "value"),
    [
        (VECTOR, [0.5, -1.25, 3, 1e30, -0.0]),  # one flat row, an integer, a large float
        (VECTOR, [[0.1, 0.2, 0.3, 0.4, 0.5], [1, 2, 3, 4, 5]]),  # several rows
        (VECTOR, np.array([[0.1, 0.2, 0.3, 0.4, 0.5]])),  # already an array (simdjson)
        (VECTOR, np.arange(5, dtype=np.int64)),
        (BOUNDED, [-1.0, 0.0, 1.0]),  # on the bounds
        (BOUNDED, [0.41887903213500977, 0.2, 0.3]),  # a float64 that rounds in float32
        (MATRIX, [[0.1, 0.2, 0.3], [1.0, 1.5, 2.0]]),
        (MATRIX, [[[0.0] * 3] * 2] * 4),
        (IMAGE, np.arange(24).reshape(2, 3, 4).tolist()),  # one image
        (IMAGE, [np.full((2, 3, 4), 255).tolist()] * 3),  # three images
        (IMAGE, np.arange(24, dtype=np.int64).reshape(2, 3, 4)),
        (DIMMED, [[0, 100], [50, 7]]),
    ],
)
def test_the_fast_paths_give_what_the_general_path_gives(space: dict[str, Any], value: Any) -> None:
    same_as_general(space, value)


@pytest.mark.parametrize(
    ("space", "value", "words"),
    [
        (VECTOR, [0.1, 0.2, 0.3], "expected shape (5,)"),
        (VECTOR, ["a", 0, 0, 0, 0], "expected numbers"),
        (VECTOR, [0.0, float("nan"), 0, 0, 0], "finite"),
        (VECTOR, [0.0, 1e39, 0, 0, 0], "does not fit in float32"),
        (VECTOR, [[0.0] * 5, [0.0] * 4], "rectangular"),
        (VECTOR, [], "expected shape"),
        (BOUNDED, [1.5, 0.0, 0.0], "outside the space's bounds"),
        (BOUNDED, np.array([0.0, 0.0, -3.0]), "outside the space's bounds"),
        (MATRIX, [[0.0] * 3, [0.0] * 2], "rectangular"),
        (IMAGE, np.full((2, 3, 4), 256).tolist(), "outside the space's bounds"),
        (IMAGE, np.full((2, 3, 4), 0.5).tolist(), "expected integers"),
        (IMAGE, [[[0] * 4] * 3, [[0] * 4] * 2], "rectangular"),
        (IMAGE, [[[0] * 4] * 3, [[0] * 3, [0] * 4, [0] * 5]], "rectangular"),
        (IMAGE, np.full((2, 3, 4), -1), "outside the space's bounds"),
        (DIMMED, [[0, 101], [0, 0]], "outside the space's bounds"),
    ],
)
def test_what_the_fast_paths_refuse_gets_the_general_paths_error(
    space: dict[str, Any], value: Any, words: str
) -> None:
    with pytest.raises(InvalidInput, match=r"^observations: ") as caught:
        validator(space)(value)
    assert words in caught.value.message


def test_integral_floats_in_an_image_take_the_general_path_and_are_accepted() -> None:
    batch = validator(IMAGE)(np.full((2, 3, 4), 7.0).tolist())
    assert batch.arrays[None].dtype == np.uint8
    assert batch.single


def test_random_float_rows_agree_with_the_general_path() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = rng.standard_normal((int(rng.integers(1, 5)), 5)) * 10.0 ** rng.integers(-3, 6)
        same_as_general(VECTOR, rows.tolist())
        same_as_general(VECTOR, rows[0].tolist())


def test_feeds_are_named_by_the_contracts_inputs() -> None:
    checked = validator(VECTOR)
    feeds = checked.feeds(checked([0.0] * 5))
    assert list(feeds) == ["obs"]
    assert feeds["obs"].shape == (1, 5)


# --------------------------------------------------------------------------- options


def test_a_request_without_parameters_shares_the_default_options() -> None:
    assert predict_options({}) is DEFAULT_OPTIONS
    assert DEFAULT_OPTIONS.deterministic
    assert DEFAULT_OPTIONS.outputs == {OutputKind.ACTIONS}


def test_parameters_become_options() -> None:
    options = predict_options({"deterministic": False, "seed": 3, "outputs": ["log_probs"]})
    assert (options.deterministic, options.seed) == (False, 3)
    assert options.outputs == {OutputKind.LOG_PROBS}
    again = predict_options({"outputs": ["log_probs"]})
    assert again.outputs is options.outputs  # the set is built once


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"deterministic": "yes"}, 'deterministic: expected true or false, got "yes"'),
        ({"seed": -1}, "seed: expected a non-negative integer, got -1"),
        ({"seed": True}, "seed: expected a non-negative integer, got true"),
        ({"seed": 1.5}, "seed: expected a non-negative integer"),
        ({"outputs": []}, "outputs: expected a non-empty list drawn from"),
        ({"outputs": ["actions", "everything"]}, 'got ["actions", "everything"]'),
        ({"outputs": "actions"}, "outputs: expected a non-empty list"),
        ({"outputs": [["actions"]]}, "outputs: expected a non-empty list"),
    ],
)
def test_bad_parameters_are_named(parameters: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        predict_options(parameters)
    assert words in caught.value.message
