"""Values a client sent appear in error messages as JSON, as the client wrote them."""

from __future__ import annotations

import pytest

from kernel.json_shown import json_shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (1.5, "1.5"),
        ("yes", '"yes"'),
        ([1, "a", None], '[1, "a", null]'),
        ({"k": True}, '{"k": true}'),
        (None, "nothing (null or missing)"),
        ("é", '"é"'),
    ],
)
def test_short_values_are_their_json_text(value: object, shown: str) -> None:
    assert json_shown(value) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("x" * 100, "a string of 102 characters"),
        (list(range(1000)), "an array of 4,890 characters"),
        ({"k": "v" * 100}, "an object of 109 characters"),
        (10**80, "a number of 81 characters"),
    ],
)
def test_long_values_are_named_by_json_type_and_length(value: object, shown: str) -> None:
    assert json_shown(value) == shown
