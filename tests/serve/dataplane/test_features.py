"""The feature lookup's request-side rules, without a server or a store: entity ids,
overrides, stored text and packed values as float rows, a Dict view's rows by key, and a
view checked against a version's observation space."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from serve.config import FeatureView
from serve.contract import PolicyContract
from serve.control.repository import check_view
from serve.dataplane import features
from serve.errors import ContractError, InvalidInput
from serve.spaces import Box, Dict, Discrete

STORE = "redis://127.0.0.1:6379/0"
FLAT = FeatureView.model_validate({"store": STORE, "entity": "cart", "features": ["x", "v", "t"]})
KEYED = FeatureView.model_validate(
    {
        "store": STORE,
        "entity": "robot",
        "features": {"body": ["bx", "by", "bz"], "goal": ["gx", "gy"]},
        "overridable": ["gy"],
    }
)


def test_entities_are_one_id_or_a_list_of_them() -> None:
    one = features.entity_rows(FLAT, 42)
    assert (one.keys, one.ids, one.single) == (["cart:42"], [42], True)
    many = features.entity_rows(FLAT, ["a", 7])
    assert (many.keys, many.single) == (["cart:a", "cart:7"], False)
    with pytest.raises(InvalidInput, match="an empty list"):
        features.entity_rows(FLAT, [])
    with pytest.raises(InvalidInput, match=r"entities\[1\]: expected an entity id"):
        features.entity_rows(FLAT, ["a", -1])
    with pytest.raises(InvalidInput, match="4,097 entities; a request names 4,096 at most"):
        features.entity_rows(FLAT, list(range(features.MAX_ENTITIES + 1)))


def test_stored_text_becomes_float_rows_with_nan_where_missing_or_no_number() -> None:
    rows: list[list[Any]] = [[b"0.5", None, b"-2"], [b"inf", b"ten", b"1e-3"]]
    values = features._floats(rows, 3)
    assert values.dtype == np.float32
    expected = np.array([[0.5, np.nan, -2.0], [np.nan, np.nan, 1e-3]], np.float32)
    np.testing.assert_array_equal(values, expected)


def test_a_hash_answer_is_picked_in_the_views_order() -> None:
    picker = features._Picker(["x", "v", "t"])
    assert picker.values([b"t", b"3", b"x", b"1", b"v", b"2", b"extra", b"9"]) == [
        b"1",
        b"2",
        b"3",
    ]
    assert picker.values([b"t", b"3"]) == [None, None, b"3"]  # missing: each on its own
    assert features._Picker(["x"]).values([b"x", b"1"]) == [b"1"]  # one feature


def test_packed_vectors_of_another_length_are_missing_rows() -> None:
    good = np.array([1.0, 2.0, 3.0], "<f4").tobytes()
    values = features._packed([good, None, good[:8]], 3)
    np.testing.assert_array_equal(values[0], [1.0, 2.0, 3.0])
    assert np.isnan(values[1:]).all()


def test_overrides_replace_overridable_features_only() -> None:
    rows = np.zeros((2, 5), np.float32)
    features.overridden(KEYED, rows, [{"gy": 1.5}, {}])
    assert rows[0, 4] == 1.5
    assert rows[1, 4] == 0
    with pytest.raises(InvalidInput, match="'bx' may not be given by a request"):
        features.overridden(KEYED, rows, {"bx": 1.0})
    with pytest.raises(InvalidInput, match="expected a finite number"):
        features.overridden(KEYED, rows, {"gy": "1"})
    with pytest.raises(InvalidInput, match="a list of 2 such objects"):
        features.overridden(KEYED, rows, [{}])


def test_a_dict_views_rows_are_split_by_observation_key() -> None:
    rows = np.arange(10, dtype=np.float32).reshape(2, 5)
    many = features.observations(KEYED, rows, single=False)
    np.testing.assert_array_equal(many["body"], [[0, 1, 2], [5, 6, 7]])
    np.testing.assert_array_equal(many["goal"], [[3, 4], [8, 9]])
    one = features.observations(KEYED, rows[:1], single=True)
    np.testing.assert_array_equal(one["goal"], [3, 4])
    flat = features.observations(FLAT, rows[:, :3], single=True)
    np.testing.assert_array_equal(flat, [0, 1, 2])
    assert features.used(KEYED, rows, single=False)["gx"] == [3.0, 8.0]


def contract(space: Any) -> PolicyContract:
    return PolicyContract.model_construct(observation_space=space)


VECTORS = Dict(spaces={"body": Box(shape=(3,)), "goal": Box(shape=(2,))})


@pytest.mark.parametrize(
    ("view", "space", "message"),
    [
        (FLAT, Box(shape=(3,)), None),
        (KEYED, VECTORS, None),
        (FLAT, Box(shape=(4,)), "lists 3 features .* observation has 4 values"),
        (FLAT, Box(shape=(3,), dtype="uint8"), "a 1-D float Box"),
        (FLAT, VECTORS, "builds a flat float observation"),
        (KEYED, Box(shape=(5,)), r"lists features by observation key \(\['body', 'goal'\]\)"),
        (
            KEYED,
            Dict(spaces={"body": Box(shape=(3,)), "aim": Box(shape=(2,))}),
            r"keys \['body', 'goal'\], but this version's Dict space has \['aim', 'body'\]",
        ),
        (
            KEYED,
            Dict(spaces={"body": Box(shape=(3,)), "goal": Box(shape=(3,))}),
            "lists 2 features for 'goal' .* observation 'goal' has 3 values",
        ),
        (
            KEYED,
            Dict(spaces={"body": Box(shape=(3,)), "goal": Discrete(n=2)}),
            "a flat float observation 'goal'",
        ),
    ],
)
def test_a_view_is_checked_against_the_observation_space(
    view: FeatureView, space: Any, message: str | None
) -> None:
    if message is None:
        check_view(view, contract(space), "m/1")
        return
    with pytest.raises(ContractError, match=message):
        check_view(view, contract(space), "m/1")
