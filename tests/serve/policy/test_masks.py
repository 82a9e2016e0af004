"""Action masks are checked like observations: shape, booleans, a legal action per row."""

from __future__ import annotations

import numpy as np
import pytest

from kernel.errors import InvalidInput
from kernel.spaces import Discrete, MultiDiscrete
from serve.policy.masks import ActionMasks


def test_a_single_mask_and_a_batch_of_them_become_bool_rows() -> None:
    masks = ActionMasks("action_mask", Discrete(n=3), 3)
    assert masks([1, 0, 1], 1, single=True).tolist() == [[True, False, True]]
    rows = masks(np.array([[True, False, False], [False, False, True]]), 2, single=False)
    assert rows.dtype == np.bool_
    assert rows.shape == (2, 3)


def test_each_dimension_of_a_multidiscrete_space_needs_a_legal_action() -> None:
    masks = ActionMasks("action_mask", MultiDiscrete(nvec=(2, 3)), 5)
    assert masks([True, False, False, False, True], 1, single=True).shape == (1, 5)
    with pytest.raises(
        InvalidInput, match=r"action_masks\[0\]: no legal action in action dimension 1"
    ):
        masks([True, True, False, False, False], 1, single=True)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([[1, 0, 1]], "shape [1, 3]; give one mask of 3 booleans"),
        ([1.0, 0.0, 1.0], "expected booleans (or 0 and 1)"),
        ([[1, 0], [1]], "expected booleans"),
        ("yes", "expected booleans"),
    ],
)
def test_what_is_not_a_mask_is_refused_saying_what_one_is(value: object, fragment: str) -> None:
    with pytest.raises(InvalidInput, match="action_masks: ") as refused:
        ActionMasks("action_mask", Discrete(n=3), 3)(value, 1, single=True)
    assert fragment in refused.value.message
