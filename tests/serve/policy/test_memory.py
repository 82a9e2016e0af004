"""A recurrent policy's memory in a request: state rows and episode starts, checked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernel.errors import InvalidInput
from serve.policy.memory import MemoryInputs

SIZE = 4


@pytest.fixture
def memory() -> MemoryInputs:
    return MemoryInputs("state", "episode_start", SIZE)


def test_a_start_without_state_begins_at_zeros(memory: MemoryInputs) -> None:
    given = memory(None, True, 1, single=True)
    assert given.state.shape == (1, SIZE)
    assert not given.state.any()
    assert given.episode_start.tolist() == [True]
    rows = memory(None, [1, 1, 1], 3, single=False)
    assert rows.state.shape == (3, SIZE)
    assert rows.episode_start.all()


def test_a_state_row_per_observation_becomes_float32_rows(memory: MemoryInputs) -> None:
    given = memory([[1, 2, 3, 4], [0.5, 0, 0, 0]], [False, True], 2, single=False)
    assert given.state.dtype == np.float32
    assert given.state.shape == (2, SIZE)
    assert given.episode_start.tolist() == [False, True]
    single = memory([0.0, 1.0, 2.0, 3.0], None, 1, single=True)
    assert single.state.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert single.episode_start.tolist() == [False]
    broadcast = memory(np.zeros((3, SIZE)), False, 3, single=False)
    assert broadcast.episode_start.tolist() == [False] * 3


@pytest.mark.parametrize(
    ("state", "starts", "rows", "single", "message"),
    [
        (
            None,
            None,
            1,
            True,
            r"state: required: this policy is recurrent; .*one row of 4 floats\)",
        ),
        (None, [True, False], 2, False, r"state: required: .*\(2\)"),
        ([1, 2, 3], None, 1, True, r"state: shape \[3\]; send one row of 4 floats"),
        ([[1, 2, 3, 4]], None, 2, False, r"state: shape \[1, 4\]; .* per observation \(2\)"),
        (["a", "b", "c", "d"], None, 1, True, "state: expected numbers"),
        ([[1, 2], [3]], None, 2, False, "state: expected numbers"),
        ([0, float("nan"), 0, 0], None, 1, True, r"state\[0\]: .* not finite"),
        ([1, 2, 3, 4], "yes", 1, True, "episode_start: expected true or false"),
        ([[0] * 4] * 2, [True], 2, False, "episode_start: expected true, false .* 2 booleans"),
        ([[0] * 4] * 2, [2, 0], 2, False, "episode_start: expected"),
    ],
)
def test_bad_memory_is_refused_naming_what_to_send(
    memory: MemoryInputs, state: Any, starts: Any, rows: int, single: bool, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        memory(state, starts, rows, single=single)
