"""Keys given twice inside a predict body's objects are refused, naming the key and where."""

from __future__ import annotations

import pytest

from serve.dataplane.json_keys import refuse_repeated_keys
from serve.errors import InvalidInput


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"observations": {"pos": [0.1], "pos": [0.9]}}', 'observations: the key(s) "pos"'),
        (
            b'{"observations": [{"pos": [1], "v": 0}, {"v": 1, "pos": [2], "v": 3}]}',
            'observations[1]: the key(s) "v"',
        ),
        (
            b'{"observations": [{"a": {"x": 1, "x": 2}}], "deterministic": true}',
            'observations[0].a: the key(s) "x"',
        ),
        (
            b'{"observations": {"b": [{"c": 1}], "a": {"k": 1, "k": 2, "j": 0, "j": 1}}}',
            'observations.a: the key(s) "k", "j"',
        ),
        (b'{"observations": [1], "actions": [{"m": 1, "m": 1}]}', 'actions[0]: the key(s) "m"'),
    ],
)
def test_a_nested_key_given_twice_is_refused_naming_it_and_where(body: bytes, where: str) -> None:
    with pytest.raises(InvalidInput, match="appear more than once in one object") as refused:
        refuse_repeated_keys(body)
    assert refused.value.message.startswith(where), refused.value.message


@pytest.mark.parametrize(
    "body",
    [
        b'{"observations": [1, 2, 3]}',
        b'{"observations": {"pos": [0.1], "vel": [0.2]}}',
        b'{"observations": [{"pos": [1]}, {"pos": [2]}]}',  # the same key in two objects
        b'{"observations": {"a": "{\\"a\\": 1, \\"a\\": 2}"}}',  # inside a string: text
    ],
)
def test_bodies_without_a_repeated_key_pass(body: bytes) -> None:
    refuse_repeated_keys(body)
