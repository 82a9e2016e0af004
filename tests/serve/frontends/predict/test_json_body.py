"""Predict bodies into arrays: what the simdjson path takes it decodes exactly as orjson
would, and everything else is left to orjson untouched."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from kernel.errors import InvalidInput, MalformedRequest
from serve.frontends.predict.http import PARAMETERS
from serve.frontends.predict.json_body import MAX_DEPTH, PredictBodyDecoder


@pytest.fixture
def decoder() -> PredictBodyDecoder:
    return PredictBodyDecoder(frozenset(PARAMETERS))


@pytest.mark.parametrize(
    ("observations", "dtype"),
    [
        ([0.5, -1.0, 3.25], np.float64),
        ([1, 2, 3], np.int64),
        ([[1, 2.5], [3, 4]], np.float64),
        (np.arange(24).reshape(2, 3, 4).tolist(), np.int64),
        ([[[[0] * 2] * 3] * 2] * 5, np.int64),
        ([1e300, -0.0, 5e-324], np.float64),
    ],
)
def test_rectangular_numbers_become_an_array_with_their_values(
    decoder: PredictBodyDecoder, observations: Any, dtype: type
) -> None:
    body = orjson.dumps({"observations": observations})
    decoded = decoder.decode(body)["observations"]
    assert isinstance(decoded, np.ndarray)
    assert decoded.dtype == dtype
    np.testing.assert_array_equal(decoded, np.asarray(observations))


def test_parameters_come_back_as_python_values(decoder: PredictBodyDecoder) -> None:
    payload = {
        "observations": [0.0, 1.0],
        "deterministic": False,
        "seed": 9,
        "outputs": ["actions", "log_probs"],
    }
    decoded = decoder.decode(orjson.dumps(payload))
    assert isinstance(decoded["observations"], np.ndarray)
    assert {k: v for k, v in decoded.items() if k != "observations"} == {
        "deterministic": False,
        "seed": 9,
        "outputs": ["actions", "log_probs"],
    }


@pytest.mark.parametrize(
    "body",
    [
        b'{"observations": [[1, 2], [3]]}',  # ragged
        b'{"observations": [[], [1, 2], 3]}',  # nesting that flattens to the right count
        b'{"observations": [1, [2], 3]}',  # a hidden nested array
        b'{"observations": [[1, [2]], [[], 4]]}',  # rows of equal length hiding nesting
        b'{"observations": [' + b"[1, 2], " * 8 + b"[1, [2]]]}",  # as many: "[" counted
        b'{"observations": [1, "2", 3]}',
        b'{"observations": ["true", "false"]}',  # words in strings are no booleans
        b'{"observations": {"is_true": [1], "false_start": 0}, "deterministic": false}',
        b'{"observations": [1, null]}',
        b'{"observations": []}',
        b'{"observations": 3}',
        b'{"observations": {"a": [1]}}',
        b'{"observations": [1, 2], "actions": [0, 1]}',  # scoring: the general path
        b'{"observations": [1, 2], "outputs": ["log_probs", ["actions"]]}',
        b'{"observations": [1, 2], "seed": {"a": 1}}',
        b'{"observations": [1, 2], "obs": 1}',
        b'{"observations": [123456789012345678901234567890]}',
    ],
)
def test_anything_else_is_decoded_by_orjson_unchanged(
    decoder: PredictBodyDecoder, body: bytes
) -> None:
    decoded = decoder.decode(body)
    assert decoded == orjson.loads(body)
    assert not any(isinstance(v, np.ndarray) for v in decoded.values())


def test_a_bracket_inside_a_parameter_string_is_counted_as_text(
    decoder: PredictBodyDecoder,
) -> None:
    decoded = decoder.decode(b'{"observations": [[1, 2], [3, 4]], "outputs": ["a[b", "]["]}')
    np.testing.assert_array_equal(decoded["observations"], [[1, 2], [3, 4]])
    assert decoded["outputs"] == ["a[b", "]["]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"observations": [0.1, ', "not valid JSON"),
        (b'{"observations": [NaN]}', "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"", "not valid JSON"),
        (b'{"observations": [1, 2], "observations": [3, 4]}', "appear more than once"),
        (b'{"seed": 1, "observations": [1], "seed": 2}', r'key\(s\) "seed" appear more than once'),
    ],
)
def test_malformed_bodies_get_orjsons_error(
    decoder: PredictBodyDecoder, body: bytes, words: str
) -> None:
    with pytest.raises(MalformedRequest, match=words):
        decoder.decode(body)


def test_one_parser_decodes_body_after_body(decoder: PredictBodyDecoder) -> None:
    rng = np.random.default_rng(0)
    for i in range(200):
        rows = rng.standard_normal((int(rng.integers(1, 4)), 7))
        body = orjson.dumps({"observations": rows.tolist()})
        if i % 7 == 0:
            decoder.decode(b'{"observations": [1, "x"]}')  # a body the fast path leaves
        decoded = decoder.decode(body)["observations"]
        np.testing.assert_array_equal(decoded, rows)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"observations": [true, false]}', "observations[0]: true"),
        (b'{"observations": [0.5, false, 1.0]}', "observations[1]: false"),
        (
            b'{"observations": [[0, 1], [2, true]], "deterministic": true}',
            "observations[1][1]: true",
        ),
        (b'{"deterministic": false, "observations": [[0, 1.5, true]]}', "observations[0][2]: true"),
        (b'{"observations": {"pos": [0.1, 0.2], "mode": true}}', "observations.mode: true"),
        (b'{"observations": [{"pos": [0.1, false]}]}', "observations[0].pos[1]: false"),
        (b'{"observations": [0, 1], "actions": [1, true]}', "actions[1]: true"),
        (b'{"observations": [[0, [1, true]], false]}', "observations[0][1][1]: true"),  # in order
        (b'{"observations": [0, 1], "actions": true, "outputs": ["log_probs"]}', "actions: true"),
    ],
)
def test_booleans_among_the_numbers_are_refused_by_their_place(
    decoder: PredictBodyDecoder, body: bytes, where: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        decoder.decode(body)
    assert refused.value.message == (
        f"{where} is a boolean; expected a number (1 for true, 0 for false)"
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"observations": [0.5, 1.0], "deterministic": true}',  # the fast path
        b'{"observations": [[0.5], [1.0]], "deterministic": false}',
        b'{"observations": {"pos": [0.5]}, "deterministic": true}',  # orjson
        b'{"observations": [0.5], "actions": [1], "deterministic": false}',
        b'{"observations": [0.5], "outputs": ["true"]}',  # more words than parameters: walked
    ],
)
def test_booleans_as_parameters_stay_valid(decoder: PredictBodyDecoder, body: bytes) -> None:
    decoded = decoder.decode(body)
    assert {k: v for k, v in decoded.items() if k != "observations"} == {
        k: v for k, v in orjson.loads(body).items() if k != "observations"
    }
    np.testing.assert_array_equal(decoded["observations"], orjson.loads(body)["observations"])


def test_a_decoder_told_actions_are_a_parameter_still_checks_them() -> None:
    decoder = PredictBodyDecoder(frozenset({*PARAMETERS, "actions"}))
    with pytest.raises(InvalidInput, match=r"^actions\[0\]: true is a boolean"):
        decoder.decode(b'{"observations": [1.0], "actions": [true]}')


def test_the_boolean_is_found_at_any_depth_orjson_takes(decoder: PredictBodyDecoder) -> None:
    depth = 1000
    body = b'{"observations": ' + b"[" * depth + b"false" + b"]" * depth + b"}"
    with pytest.raises(InvalidInput) as refused:
        decoder.decode(body)
    assert refused.value.message.startswith("observations" + "[0]" * depth + ": false is")


def nested(depth: int, innermost: bytes = b"0.5") -> bytes:
    return b"[" * depth + innermost + b"]" * depth


@pytest.mark.parametrize(
    "body",
    [
        b'{"observations": %s}' % nested(65),  # the simdjson path: numbers only
        b'{"observations": %s, "deterministic": true}' % nested(65),
        b'{"observations": %s, "actions": [0]}' % nested(65),  # orjson's: it has actions
        b'{"observations": [%s, 1]}' % nested(64),  # orjson's: ragged
        b'{"observations": {"camera": %s}}' % nested(65),  # orjson's: a Dict space
        b'{"observations": [[0.5]], "actions": %s}' % nested(65, b"1"),
    ],
    ids=["fast", "fast-with-parameter", "scoring", "ragged", "dict", "actions"],
)
def test_lists_nested_past_the_depth_limit_are_refused_on_every_path(
    decoder: PredictBodyDecoder, body: bytes
) -> None:
    with pytest.raises(InvalidInput, match=rf"lists nested 6\d deep; at most {MAX_DEPTH} are"):
        decoder.decode(body)


def test_lists_nested_to_the_depth_limit_are_decoded(decoder: PredictBodyDecoder) -> None:
    decoded = decoder.decode(b'{"observations": %s}' % nested(MAX_DEPTH))["observations"]
    assert decoded.shape == (1,) * MAX_DEPTH
    assert decoder.decode(b'{"observations": %s, "actions": [0]}' % nested(MAX_DEPTH))
