"""The sequence table's rules (serve.batching.sequences), one test per rule."""

from __future__ import annotations

import numpy as np
import pytest

from kernel.errors import Conflict, InvalidInput, QueueFull
from serve.batching.sequences import SequenceTable
from serve.dataplane.messages import SequenceStep

SIZE = 3


def step(ids: list[str | int], *, start: bool = False, end: bool = False) -> SequenceStep:
    rows = len(ids)
    return SequenceStep(
        tuple(ids), np.full(rows, start), np.full(rows, end), "state", "episode_start", SIZE
    )


def answered(table: SequenceTable, taken: SequenceStep, version: int, now: float) -> np.ndarray:
    """Begin and commit a step whose next state is the fed state + 1 (a counter)."""
    held = table.begin(taken, SIZE, now)
    table.commit(taken, held.state + 1, version, now)
    return held.state


def test_rule_1_a_start_begins_at_zeros_and_keeps_the_version_that_ran_it() -> None:
    table = SequenceTable("m", 8, 60)
    held = table.begin(step(["a"], start=True), SIZE, now=0)
    assert held.version is None  # the route's version runs it
    assert not held.state.any()
    table.commit(step(["a"], start=True), held.state + 1, version=3, now=0)
    assert table.versions() == {3}
    again = table.begin(step(["a"]), SIZE, now=1)
    assert again.version == 3
    assert again.state.tolist() == [[1.0] * SIZE]


def test_rule_1_a_start_on_a_live_id_starts_it_over() -> None:
    table = SequenceTable("m", 8, 60)
    answered(table, step(["a"], start=True), 1, 0)
    answered(table, step(["a"]), 1, 1)
    restarted = answered(table, step(["a"], start=True), 2, 2)
    assert not restarted.any()
    assert table.versions() == {2}


def test_rule_2_an_unknown_or_ended_sequence_is_refused_saying_how_to_start() -> None:
    table = SequenceTable("m", 8, 60)
    with pytest.raises(InvalidInput, match=r'sequence_id "b": no such live sequence .*start'):
        table.begin(step(["b"]), SIZE, now=0)
    answered(table, step([7], start=True), 1, 0)
    answered(table, step([7], end=True), 1, 1)
    assert len(table) == 0
    with pytest.raises(InvalidInput, match="sequence_id 7: no such live sequence"):
        table.begin(step([7]), SIZE, now=2)


def test_rule_3_one_step_at_a_time() -> None:
    table = SequenceTable("m", 8, 60)
    answered(table, step(["a"], start=True), 1, 0)
    table.begin(step(["a"]), SIZE, now=1)
    with pytest.raises(Conflict, match="a step of this sequence is in flight"):
        table.begin(step(["a"]), SIZE, now=1)
    with pytest.raises(Conflict, match="in flight"):
        table.begin(step(["a"], start=True), SIZE, now=1)


def test_rule_4_a_call_runs_on_one_version() -> None:
    table = SequenceTable("m", 8, 60)
    answered(table, step(["old"], start=True), 1, 0)
    answered(table, step(["new"], start=True), 2, 0)
    with pytest.raises(Conflict, match=r"versions \[1, 2\]"):
        table.begin(step(["old", "new"]), SIZE, now=1)
    mixed = SequenceStep(
        ("old", "fresh"), np.array([False, True]), np.zeros(2, bool), "state", "s", SIZE
    )
    assert table.begin(mixed, SIZE, now=1).version == 1


def test_rule_5_idle_sequences_are_evicted_and_say_so() -> None:
    table = SequenceTable("m", 8, idle_timeout_s=10)
    answered(table, step(["a"], start=True), 1, 0)
    with pytest.raises(InvalidInput, match=r"evicted \(it was idle for more than 10 s\)"):
        table.begin(step(["a"]), SIZE, now=11)
    assert table.evictions == 1


def test_rule_5_a_full_table_evicts_the_least_recently_used_idle_sequence() -> None:
    table = SequenceTable("m", 2, 60)
    answered(table, step(["a"], start=True), 1, 0)
    answered(table, step(["b"], start=True), 1, 1)
    answered(table, step(["a"]), 1, 2)  # b is now the least recently used
    answered(table, step(["c"], start=True), 1, 3)
    with pytest.raises(InvalidInput, match=r"evicted .*table of 2 sequences was full"):
        table.begin(step(["b"]), SIZE, now=4)
    table.begin(step(["a", "c"]), SIZE, now=5)  # both in flight: no room for another
    with pytest.raises(QueueFull, match="each with a step in flight"):
        table.begin(step(["d"], start=True), SIZE, now=5)


def test_rule_5_room_is_never_made_by_evicting_a_sequence_of_the_same_step() -> None:
    table = SequenceTable("m", 2, 60)
    answered(table, step(["a"], start=True), 1, 0)
    answered(table, step(["b"], start=True), 1, 1)
    both = SequenceStep(("a", "c"), np.array([False, True]), np.zeros(2, bool), "state", "s", SIZE)
    table.begin(both, SIZE, now=2)  # a is the least recently used, but steps here: b goes
    with pytest.raises(InvalidInput, match="evicted"):
        table.begin(step(["b"]), SIZE, now=3)


def test_rule_6_a_failed_step_leaves_its_sequences_as_they_were() -> None:
    table = SequenceTable("m", 8, 60)
    answered(table, step(["a"], start=True), 1, 0)
    failed = step(["a"])
    before = table.begin(failed, SIZE, now=1)
    table.abort(failed, now=1)
    assert table.begin(step(["a"]), SIZE, now=2).state.tolist() == before.state.tolist()
    started = step(["new"], start=True)
    table.begin(started, SIZE, now=2)
    table.abort(started, now=2)
    with pytest.raises(InvalidInput, match="no such live sequence"):
        table.begin(step(["new"]), SIZE, now=3)


def test_rows_of_one_call_each_carry_their_own_state() -> None:
    table = SequenceTable("m", 8, 60)
    answered(table, step(["a", "b"], start=True), 1, 0)
    answered(table, step(["a"]), 1, 1)
    held = table.begin(step(["b", "a"]), SIZE, now=2)
    assert held.state[:, 0].tolist() == [1.0, 2.0]


def owned(
    ids: list[str | int], owner: str | None, *, start: bool = False, end: bool = False
) -> SequenceStep:
    rows = len(ids)
    return SequenceStep(
        tuple(ids), np.full(rows, start), np.full(rows, end), "state", "episode_start", SIZE, owner
    )


def refusal(table: SequenceTable, taken: SequenceStep, now: float) -> str:
    with pytest.raises(InvalidInput) as refused:
        table.begin(taken, SIZE, now)
    return refused.value.message


def test_rule_7_only_the_owner_steps_or_ends_its_sequence_and_others_learn_nothing() -> None:
    table = SequenceTable("m", 8, 60)
    answered(table, owned(["s"], "key-a", start=True), 1, 0)
    never_started = refusal(table, owned(["t"], "key-b"), 1)
    for other in ("key-b", None):
        assert refusal(table, owned(["s"], other), 1) == never_started.replace('"t"', '"s"')
        refusal(table, owned(["s"], other, end=True), 1)  # nor ended by another
    # another owner's start under the same id is its own sequence: "s" of key-a goes on
    assert not answered(table, owned(["s"], "key-b", start=True), 1, 2).any()
    assert table.begin(owned(["s"], "key-a"), SIZE, now=3).state.tolist() == [[1.0] * SIZE]
    table.commit(owned(["s"], "key-a", end=True), np.zeros((1, SIZE)), 1, now=3)
    assert refusal(table, owned(["s"], "key-a"), 4).startswith('sequence_id "s": no such')
    assert answered(table, owned(["s"], "key-b"), 1, 4).tolist() == [[1.0] * SIZE]


def test_rule_5_past_its_quota_an_owner_evicts_its_own_sequences_never_anothers() -> None:
    table = SequenceTable("m", 8, 60, per_owner=2)
    answered(table, owned(["b1"], "key-b", start=True), 1, 0)
    for t, sequence in enumerate(["a1", "a2", "a3"], start=1):
        answered(table, owned([sequence], "key-a", start=True), 1, t)
    assert "its sequence_owner held max_sequences_per_owner (2)" in refusal(
        table, owned(["a1"], "key-a"), 4
    )
    answered(table, owned(["b1"], "key-b"), 1, 4)  # still live
    table.begin(owned(["a2", "a3"], "key-a"), SIZE, now=5)  # both in flight: none to evict
    with pytest.raises(QueueFull, match=r"this sequence_owner holds 2 .*max_sequences_per_owner"):
        table.begin(owned(["a4"], "key-a", start=True), SIZE, now=5)
    with pytest.raises(InvalidInput, match=r"this call starts 3 sequences; .* at most 2"):
        table.begin(owned(["x", "y", "z"], "key-c", start=True), SIZE, now=5)
    answered(table, owned(["c1", "c2"], "key-c", start=True), 1, 6)  # room for key-c's own
    assert table.describe()["per_owner"] == 2


def test_rule_5_a_full_table_evicts_no_other_owners_live_sequence() -> None:
    table = SequenceTable("m", 2, idle_timeout_s=10)
    answered(table, owned(["a"], "key-a", start=True), 1, 0)
    answered(table, owned(["b"], None, start=True), 1, 5)
    for newcomer in ("key-c", None):
        if newcomer is None:  # the ownerless evict their own least recently used: "b"
            answered(table, owned(["c"], newcomer, start=True), 1, 6)
            continue
        with pytest.raises(QueueFull, match="never another owner's live one"):
            table.begin(owned(["c"], newcomer, start=True), SIZE, now=6)
    assert "table of 2 sequences was full" in refusal(table, owned(["b"], None), 7)
    answered(table, owned(["c"], "key-c", start=True), 1, 11)  # "a" idle past 10 s: it goes
    assert "idle for more than 10 s" in refusal(table, owned(["a"], "key-a"), 12)
