"""The observation bounds policy: values outside a Box's declared bounds are served as
given (allow), clipped (clip) or refused (reject), and their rows counted, with the fast
paths giving exactly what the general path gives; everything else stays strict."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernel.errors import InvalidInput
from kernel.spaces import Box, Dict, ObservationBounds, parse_observations
from serve.policy.validation import ObservationValidator
from tests.serve.policy.contracts import contract
from tests.serve.policy.test_validation import (
    BOUNDED,
    DIMMED,
    IMAGE,
    MATRIX,
    VECTOR,
    same_as_general,
    validator,
)

ALLOW, CLIP, REJECT = ObservationBounds.ALLOW, ObservationBounds.CLIP, ObservationBounds.REJECT
MODES = list(ObservationBounds)
# Like CartPole's: some dimensions bounded, some not.
MIXED = {"type": "Box", "shape": [3], "dtype": "float32", "low": [-1.0, "-inf", -0.418]}
MIXED["high"] = [1.0, "inf", 0.418]

OUTSIDE: list[tuple[dict[str, Any], Any, int]] = [
    (BOUNDED, [1.5, 0.0, -1.0], 1),  # one flat row
    (BOUNDED, [[1.5, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, -3, 0.5]], 2),  # rows, an integer
    (BOUNDED, np.array([[0.0, 0.0, 1.0000001], [0.0, 0.0, 0.0]]), 1),  # an array (simdjson)
    (BOUNDED, np.array([5, 0, 0], dtype=np.int64), 1),
    (MIXED, [2.0, 1e30, -0.5], 1),  # the unbounded dimension takes any finite value
    (MIXED, [[0.0, -1e38, 0.418000005], [0.0, 0.0, 0.419]], 1),  # rounds onto the bound
    (MATRIX, [[0.1, 0.2, 0.3], [1.0, 2.5, 2.0]], 1),
    (MATRIX, [[[0.0] * 3, [0.0, -9.0, 0.0]], [[0.0] * 3] * 2, [[3.0] * 3] * 2], 2),
    (DIMMED, [[0, 101], [50, 255]], 1),
    (DIMMED, [[[0, 0], [0, 0]], [[200, 0], [0, 0]], [[0, 0], [0, 101]]], 2),
    (DIMMED, np.array([[0, 100], [101, 7]], dtype=np.int64), 1),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("space", "value"),
    [(BOUNDED, [-1.0, 0.0, 1.0]), (MIXED, [[0.5, -1e30, 0.418]] * 3), (DIMMED, [[0, 100]] * 2)],
)
def test_observations_within_the_bounds_are_the_same_in_every_mode(
    mode: ObservationBounds, space: dict[str, Any], value: Any
) -> None:
    batch = same_as_general(space, value, mode)
    assert batch.out_of_bounds == 0
    reference = same_as_general(space, value, REJECT)
    np.testing.assert_array_equal(batch.arrays[None], reference.arrays[None])


@pytest.mark.parametrize(("space", "value", "rows"), OUTSIDE)
def test_allow_serves_values_outside_the_bounds_as_given_and_counts_their_rows(
    space: dict[str, Any], value: Any, rows: int
) -> None:
    batch = same_as_general(space, value, ALLOW)
    assert batch.out_of_bounds == rows
    given = np.asarray(value).reshape(batch.arrays[None].shape)
    np.testing.assert_array_equal(batch.arrays[None], given.astype(batch.arrays[None].dtype))


@pytest.mark.parametrize(("space", "value", "rows"), OUTSIDE)
def test_clip_clips_each_value_into_the_bounds_and_counts_the_rows_as_given(
    space: dict[str, Any], value: Any, rows: int
) -> None:
    batch = same_as_general(space, value, CLIP)
    assert batch.out_of_bounds == rows
    box = Box.model_validate(space)
    low, high = box.finite_bounds if box.dtype != "uint8" else (box.low_array, box.high_array)
    given = np.asarray(value).reshape(batch.arrays[None].shape).astype(batch.arrays[None].dtype)
    clipped = np.clip(given, low, high).astype(given.dtype)
    np.testing.assert_array_equal(batch.arrays[None], clipped)
    assert ((batch.arrays[None] >= low) & (batch.arrays[None] <= high)).all()
    assert same_as_general(space, batch.arrays[None], REJECT).out_of_bounds == 0


@pytest.mark.parametrize(("space", "value", "rows"), OUTSIDE)
def test_reject_refuses_them_naming_the_value_where_it_is_and_the_bounds(
    space: dict[str, Any], value: Any, rows: int
) -> None:
    with pytest.raises(InvalidInput) as refused:
        validator(space, REJECT)(value)
    assert refused.value.out_of_bounds == rows
    assert refused.value.message.startswith("observations: value ")
    assert "is outside the space's bounds [" in refused.value.message


def test_the_reject_message_is_the_one_from_before_bounds_were_a_policy() -> None:
    with pytest.raises(InvalidInput) as refused:
        validator(MIXED, REJECT)([[0.0, 5.0, 0.0], [0.0, 0.0, 0.5]])
    assert refused.value.message == (
        "observations: value 0.5 at index [1, 2] is outside the space's bounds [-0.418, 0.418]"
    )
    assert refused.value.code.value == "invalid_input"  # 422, as ever


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("space", "value", "words"),
    [
        (BOUNDED, [0.0, float("nan"), 0.0], "values must be finite; found nan at index [0, 1]"),
        (BOUNDED, [[0.0, 0.0, 0.0], [float("-inf"), 5.0, 0.0]], "values must be finite"),
        (VECTOR, [0.0, float("inf"), 0.0, 0.0, 0.0], "values must be finite"),
        (MIXED, [0.0, 1e39, 0.0], "value 1e+39 at index [0, 1] does not fit in float32"),
        (BOUNDED, [5.0, 0.0], "expected shape (3,)"),
        (BOUNDED, [True, "a", 0.0], "expected numbers"),
        (DIMMED, [[0, 256], [0, 0]], "[0, 0, 1]"),
        (DIMMED, [[0, -1], [0, 0]], "[0, 0, 1]"),
        (IMAGE, np.full((2, 3, 4), 256), "256 at index [0, 0, 0, 0]"),
        (DIMMED, [[0, 0.5], [0, 0]], "expected integers 0..255"),
        ({"type": "Discrete", "n": 3}, [0, 3], "value 3 at index [1] is outside"),
        ({"type": "Discrete", "n": 3}, 1.5, "expected integers for a Discrete space"),
        ({"type": "MultiBinary", "n": 2}, [0, 2], "value 2 at index [0, 1] is outside"),
        ({"type": "MultiDiscrete", "nvec": [2, 3]}, [[1, 3]], "value 3 at index [0, 1]"),
    ],
)
def test_shape_dtype_finiteness_and_discrete_indices_are_strict_in_every_mode(
    mode: ObservationBounds, space: dict[str, Any], value: Any, words: str
) -> None:
    with pytest.raises(InvalidInput, match=r"^observations: ") as refused:
        validator(space, mode)(value)
    assert words in refused.value.message
    if mode is not REJECT:  # refused as invalid, not for its bounds: nothing to count
        assert refused.value.out_of_bounds == 0


@pytest.mark.parametrize("mode", [ALLOW, CLIP])
def test_a_uint8_value_beyond_0_255_is_a_dtype_error_not_a_bound(mode: ObservationBounds) -> None:
    with pytest.raises(InvalidInput) as refused:
        validator(DIMMED, mode)([[0, 0], [300, 0]])
    assert refused.value.message == (
        "observations: value 300 at index [0, 1, 0] does not fit in uint8; expected integers 0..255"
    )


DICT = Dict.model_validate(
    {
        "type": "Dict",
        "spaces": {"pos": BOUNDED, "angle": MIXED, "mode": {"type": "Discrete", "n": 2}},
    }
)
DICT_ROWS = {
    "pos": [[1.5, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
    "angle": [[0.0, 9.0, 0.5], [0.0, 0.0, 0.0], [0.0, 0.0, -0.5], [0.0, 0.0, 0.0]],
    "mode": [0, 1, 1, 0],
}


def test_a_dict_observation_row_counts_once_whichever_of_its_boxes_it_leaves() -> None:
    allowed = parse_observations(DICT, DICT_ROWS, bounds=ALLOW)
    assert allowed.out_of_bounds == 2  # rows 0 (pos and angle) and 2 (angle)
    np.testing.assert_array_equal(allowed.arrays["pos"], np.asarray(DICT_ROWS["pos"], np.float32))
    clipped = parse_observations(DICT, DICT_ROWS, bounds=CLIP)
    assert clipped.out_of_bounds == 2
    assert clipped.arrays["pos"][0].tolist() == [1.0, 0.0, 0.0]
    np.testing.assert_array_equal(
        clipped.arrays["angle"][:, 2], np.asarray([0.418, 0.0, -0.418, 0.0], np.float32)
    )
    assert clipped.arrays["angle"][0, 1] == 9.0  # an unbounded dimension
    with pytest.raises(InvalidInput) as refused:
        parse_observations(DICT, DICT_ROWS, bounds=REJECT)
    assert refused.value.out_of_bounds == 2
    assert refused.value.message.startswith("observations.pos: value 1.5 at index [0, 0]")


def test_the_validator_applies_its_mode_to_dict_observations() -> None:
    checked = ObservationValidator(
        contract(DICT.model_dump(), {"type": "Discrete", "n": 2}), bounds=CLIP
    )
    assert checked._fast is None  # dicts take the general path
    assert checked(DICT_ROWS).out_of_bounds == 2


def test_random_rows_around_the_bounds_agree_with_the_general_path_in_every_mode() -> None:
    rng = np.random.default_rng(7)
    for _ in range(100):
        rows = rng.uniform(-1.3, 1.3, size=(int(rng.integers(1, 6)), 3))
        rows[rng.random(rows.shape) < 0.1] = 1.0  # on the bound
        expected = int((np.abs(rows) > 1.0).any(axis=1).sum())
        for mode in (ALLOW, CLIP):
            assert same_as_general(BOUNDED, rows.tolist(), mode).out_of_bounds == expected
            assert same_as_general(BOUNDED, rows, mode).out_of_bounds == expected
            assert same_as_general(BOUNDED, rows[0].tolist(), mode).out_of_bounds == int(
                (np.abs(rows[0]) > 1.0).any()
            )
        images = rng.integers(0, 130, size=(int(rng.integers(1, 4)), 2, 2))
        expected = int((images > 100).reshape(len(images), -1).any(axis=1).sum())
        for mode in (ALLOW, CLIP):
            assert same_as_general(DIMMED, images.tolist(), mode).out_of_bounds == expected
