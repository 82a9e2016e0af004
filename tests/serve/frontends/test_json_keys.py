"""Keys given twice in a JSON body's objects are refused, naming the key and where."""

from __future__ import annotations

import json

import pytest

from kernel.errors import MalformedRequest
from serve.frontends.wire import refuse_repeated_keys


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
        (b'{"max_tokens": 4, "max_tokens": 5}', 'request body: the key(s) "max_tokens"'),
        # after a scalar in its list: the colon count sees what the walk skipped
        (b'{"data": [1, {"a": 1, "a": 2}]}', 'data[1]: the key(s) "a"'),
        # a colon in a string does not hide a repeat
        (b'{"prompt": "a: b", "n": 1, "n": 2}', 'request body: the key(s) "n"'),
    ],
)
def test_a_nested_key_given_twice_is_refused_naming_it_and_where(body: bytes, where: str) -> None:
    with pytest.raises(MalformedRequest, match="appear more than once in one object") as refused:
        refuse_repeated_keys(body, json.loads(body))
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
    refuse_repeated_keys(body, json.loads(body))
