"""The experience record's encoding and the consumer-side deduplicator."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np
import pytest

from loop.experience import FORMAT, Completion, Deduplicator, Step, decode, encode
from tests.loop.buffers.contract import assert_same_step, make_completion, make_step, stepped


def with_arrays(observation, action) -> Step:
    return dataclasses.replace(make_step("e", 0), observation=observation, action=action)


@pytest.mark.parametrize(
    ("observation", "action"),
    [
        (np.zeros(4, np.float32), np.asarray(1, np.int64)),
        (np.arange(3 * 84 * 84, dtype=np.uint8).reshape(3, 84, 84), np.array([0.5, -2.0])),
        (np.array([True, False, True]), np.zeros((0, 2), np.int16)),
        (np.array([[1 + 2j]], np.complex64), np.asarray(7, np.int8)),
        (np.array([1.5, -0.25], np.float16), np.array([2**63 - 1], np.int64)),
        (np.arange(12, dtype=np.float64).reshape(3, 4).T, np.asarray(3, np.uint32)),  # strided
    ],
)
def test_arrays_round_trip_with_dtype_and_shape(observation, action):
    step = with_arrays(observation, action)
    assert_same_step(decode(encode(step)), step)


def test_big_endian_arrays_arrive_as_little_endian_with_equal_values():
    step = with_arrays(np.arange(5, dtype=">f8"), np.asarray(3, ">i4"))
    got = stepped(decode(encode(step)))
    assert got.observation.dtype == np.dtype("<f8")
    assert got.action.dtype == np.dtype("<i4")
    assert np.array_equal(got.observation, step.observation)
    assert got.action == 3


def test_every_field_round_trips_exactly():
    step = Step(
        episode_id="worker-3/env-17/ep-0042",
        step=123_456,
        observation=np.array([np.nan, np.inf, -0.0], np.float32),
        action=np.asarray(2),
        log_prob=-1.2345678901234567,
        value=1e-300,
        reward=-0.5,
        terminated=False,
        truncated=True,
        model_version=2**40 + 1,
        served_at=1_712_345_678.987654,
    )
    got = stepped(decode(encode(step)))
    assert got.key == "worker-3/env-17/ep-0042:123456"
    assert np.array_equal(got.observation, step.observation, equal_nan=True)
    for name in ("episode_id", "step", "log_prob", "value", "reward", "terminated"):
        assert getattr(got, name) == getattr(step, name)
    assert (got.truncated, got.model_version, got.served_at) == (True, 2**40 + 1, step.served_at)


def test_numpy_scalars_are_accepted_and_arrive_as_python_numbers():
    scalars: dict[str, Any] = {  # what a worker indexing numpy arrays has in hand
        "step": np.int64(5),
        "model_version": np.int32(9),
        "log_prob": np.float32(-0.5),
        "terminated": np.bool_(True),
    }
    step = dataclasses.replace(make_step("e", 0), **scalars)
    got = stepped(decode(encode(step)))
    assert (type(got.step), got.step) == (int, 5)
    assert (type(got.model_version), got.model_version) == (int, 9)
    assert (type(got.log_prob), got.log_prob) == (float, -0.5)
    assert got.terminated is True


def test_decoded_arrays_are_read_only():
    got = stepped(decode(encode(make_step("e", 0))))
    with pytest.raises(ValueError, match="read-only"):
        got.observation[0] = 1.0


def test_object_arrays_are_refused_when_encoding():
    with pytest.raises(ValueError, match="numeric or bool"):
        encode(with_arrays(np.array([{"a": 1}]), np.asarray(0)))
    with pytest.raises(ValueError, match="numeric or bool"):
        encode(with_arrays(np.array(["left"]), np.asarray(0)))


def fields(**changes):
    packed = msgpack.unpackb(encode(make_step("e", 0)))
    names = ["format", "episode_id", "step", "observation", "action", "log_prob", "value",
             "reward", "terminated", "truncated", "model_version", "served_at"]  # fmt: skip
    for name, value in changes.items():
        packed[names.index(name)] = value
    return msgpack.packb(packed, use_bin_type=True)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1 not msgpack",
        encode(make_step("e", 0))[:-3],  # truncated
        encode(make_step("e", 0)) + b"\x00",  # trailing bytes
        msgpack.packb({"episode_id": "e"}),
        msgpack.packb([FORMAT, "e"]),
        fields(format=FORMAT + 1),
        fields(episode_id=5),
        fields(step="3"),
        fields(terminated=1),
        fields(model_version=1.0),
        fields(log_prob="x"),
        fields(observation=["zz", [2], b"\x00" * 8]),  # unknown dtype
        fields(observation=["|O", [1], b"\x00" * 8]),  # object dtype
        fields(observation=["<f4", [3], b"\x00" * 8]),  # bytes do not fill the shape
        fields(observation=["<f4", [1], "text"]),
        fields(action=["<f4", [1]]),
    ],
)
def test_bad_data_is_refused_with_value_error(data):
    with pytest.raises(ValueError, match="not an experience record"):
        decode(data)


def ep(name: str, steps: range, *, ended_at: int | None = None) -> list[Step]:
    return [make_step(name, i, last=i == ended_at) for i in steps]


def test_dedupe_keeps_the_first_of_each_key():
    dedupe = Deduplicator()
    first = ep("a", range(5)) + ep("b", range(3))
    assert all(dedupe.fresh(s) for s in first)
    redelivered = ep("a", range(2, 5)) + ep("b", range(3))
    assert not any(dedupe.fresh(s) for s in redelivered)
    assert dedupe.duplicates == 6
    assert dedupe.fresh(make_step("a", 5))  # the episode continues


def test_dedupe_remembers_ended_episodes():
    dedupe = Deduplicator()
    assert all(dedupe.fresh(s) for s in ep("a", range(4), ended_at=3))
    assert not dedupe.fresh(make_step("a", 3, last=True))
    assert not dedupe.fresh(make_step("a", 0))
    assert dedupe.duplicates == 2


def test_dedupe_is_bounded_by_forgetting_the_oldest_episodes():
    dedupe = Deduplicator(max_episodes=3)
    for name in "abcd":
        assert dedupe.fresh(make_step(name, 0))
    assert not dedupe.fresh(make_step("d", 0))
    assert dedupe.fresh(make_step("a", 0))  # forgotten: bounded memory, at a known cost
    for name in "wxyz":
        assert dedupe.fresh(make_step(name, 0, last=True))
    assert not dedupe.fresh(make_step("z", 0))
    assert dedupe.fresh(make_step("w", 0, last=True))


def test_a_completion_round_trips_exactly_and_is_told_from_a_step():
    completion = make_completion("g-7", 2, size=8, version=3)
    got = decode(encode(completion))
    assert isinstance(got, Completion)
    for name in Completion.__slots__:
        a, b = getattr(got, name), getattr(completion, name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype
            assert np.array_equal(a, b)
        else:
            assert a == b, name
    assert (got.key, got.stream, got.position, got.last) == ("g-7:2", "g-7", 2, False)
    assert make_completion("g", 7, size=8).last


def test_a_groups_redelivered_completions_are_dropped():
    dedupe = Deduplicator()
    group = [make_completion("g", i, size=3) for i in range(3)]
    assert [dedupe.fresh(c) for c in group] == [True, True, True]
    assert [dedupe.fresh(c) for c in group] == [False, False, False]  # the group ended
    assert dedupe.duplicates == 3


def test_a_bad_completion_record_is_refused():
    fields = make_completion("g", 0).packed()
    fields[1] = 99
    with pytest.raises(ValueError, match="not a completion record of format"):
        decode(msgpack.packb(fields, use_bin_type=True))
    with pytest.raises(ValueError, match="not a completion record: fields"):
        decode(msgpack.packb(fields[:-1], use_bin_type=True))
