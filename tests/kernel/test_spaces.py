"""Spaces: the contract's JSON form, sampling, and request validation with clear messages."""

import numpy as np
import pytest

from kernel.errors import InvalidInput
from kernel.spaces import (
    Box,
    Dict,
    Discrete,
    MultiBinary,
    MultiDiscrete,
    input_dtype,
    parse_observations,
    sample,
)

CARTPOLE = Box.from_arrays(
    np.array([-4.8, -np.inf, -0.418, -np.inf], np.float32),
    np.array([4.8, np.inf, 0.418, np.inf], np.float32),
    "float32",
)
IMAGE = Box.from_arrays(np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8), "uint8")


def test_bounds_round_trip_through_json_with_infinities_as_text() -> None:
    text = CARTPOLE.model_dump_json()
    assert '"-inf"' in text
    again = Box.model_validate_json(text)
    np.testing.assert_array_equal(again.low_array, CARTPOLE.low_array)


def test_uniform_bounds_are_stored_as_one_number() -> None:
    assert IMAGE.low == 0.0
    assert IMAGE.high == 255.0


def test_one_observation_is_answered_in_kind() -> None:
    batch = parse_observations(CARTPOLE, [0.1, 0.2, 0.3, 0.4])
    assert batch.single
    assert batch.rows == 1
    assert batch.arrays[None].dtype == np.float32


def test_a_list_of_observations_is_a_batch() -> None:
    batch = parse_observations(CARTPOLE, [[0.0] * 4] * 3)
    assert (batch.rows, batch.single) == (3, False)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            [0.1, 0.2, 0.3],
            "expected shape (4,) for one observation or (N, 4) for N of them; got (3,)",
        ),
        (
            [0.0, 0.0, 1.0, 0.0],
            "value 1.0 at index [0, 2] is outside the space's bounds [-0.418, 0.418]",
        ),
        ([0.0, 1e39, 0.0, 0.0], "value 1e+39 at index [0, 1] does not fit in float32"),
        (["a", 0, 0, 0], 'expected numbers, got "a"'),
        ([[0.0] * 4, [0.0] * 3], "lists must be rectangular"),
        ([], "got (0,)"),
    ],
)
def test_bad_observations_are_refused_with_a_message_naming_the_problem(
    value: object, message: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_observations(CARTPOLE, value)
    assert message in caught.value.message
    assert caught.value.message.startswith("observations")


def test_non_finite_values_are_refused() -> None:
    box = Box.from_arrays(
        np.full(2, -np.inf, np.float32), np.full(2, np.inf, np.float32), "float32"
    )
    for bad in (float("nan"), float("inf")):
        with pytest.raises(InvalidInput, match="must be finite"):
            parse_observations(box, [0.0, bad])


def test_discrete_observations_must_be_integers_in_range() -> None:
    space = Discrete(n=3)
    assert parse_observations(space, 2).arrays[None].tolist() == [2]
    with pytest.raises(InvalidInput, match="outside the space's bounds"):
        parse_observations(space, 3)
    with pytest.raises(InvalidInput, match="expected integers"):
        parse_observations(space, 1.5)


def test_image_observations_stay_uint8() -> None:
    batch = parse_observations(IMAGE, np.full((4, 4, 3), 7).tolist())
    assert batch.arrays[None].dtype == np.uint8
    with pytest.raises(InvalidInput, match="outside"):
        parse_observations(IMAGE, np.full((4, 4, 3), 256).tolist())


def test_dict_observations_accept_a_mapping_or_a_list_of_mappings() -> None:
    space = Dict(
        spaces={
            "pos": Box.from_arrays(np.full(2, -1.0), np.full(2, 1.0), "float32"),
            "mode": Discrete(n=2),
        }
    )
    one = parse_observations(space, {"pos": [0.1, 0.2], "mode": 1})
    assert one.single
    many = parse_observations(
        space, [{"pos": [0.1, 0.2], "mode": 1}, {"pos": [0.0, 0.0], "mode": 0}]
    )
    assert many.rows == 2
    assert many.arrays["mode"].tolist() == [1, 0]
    with pytest.raises(InvalidInput, match="missing \\['mode'\\]"):
        parse_observations(space, {"pos": [0.1, 0.2]})
    with pytest.raises(InvalidInput, match="same number of observations"):
        parse_observations(space, {"pos": [[0.1, 0.2]], "mode": [1, 0]})


@pytest.mark.parametrize(
    "space",
    [CARTPOLE, IMAGE, Discrete(n=4, start=2), MultiDiscrete(nvec=(2, 3)), MultiBinary(n=3)],
)
def test_samples_are_valid_observations_of_their_space(
    space: Box | Discrete | MultiDiscrete | MultiBinary,
) -> None:
    drawn = sample(space, np.random.default_rng(0), 16)
    assert drawn.dtype == input_dtype(space)
    batch = parse_observations(space, drawn.tolist())
    assert batch.rows == 16


def test_wide_bounds_are_sampled_near_zero_not_uniformly() -> None:
    drawn = sample(CARTPOLE, np.random.default_rng(0), 1000)
    assert np.abs(drawn[:, 1]).max() < 10
