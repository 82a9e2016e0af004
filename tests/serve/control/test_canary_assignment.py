"""A canary's assignment of episodes to versions (serve/control/canary_assignment.py):
sticky per key in every process, the stated share of keys, a new draw per canary."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from serve.control.canary_assignment import Assignment, CanaryPlan

ROOT = Path(__file__).resolve().parents[3]
PLAN = CanaryPlan("cartpole", live_version=3, canary_version=4, share=0.1, salt="a")
KEYS = [f"actor-{i}/episode-{j}" for i in range(100) for j in range(200)]


def test_a_key_gets_the_same_version_every_time() -> None:
    rng = random.Random(0)
    for key in KEYS[:500]:
        first = PLAN.version_for(key, rng)
        assert all(PLAN.version_for(key, rng) == first for _ in range(5))
        assert first[1] is Assignment.KEYED


def test_another_process_assigns_every_key_alike() -> None:
    """Workers and restarts agree: the hash holds nothing of the process (no seeded hash)."""
    rng = random.Random(0)
    here = [PLAN.version_for(key, rng)[0] for key in KEYS[:300]]
    code = (
        "import random; from serve.control.canary_assignment import CanaryPlan; "
        "p = CanaryPlan('cartpole', live_version=3, canary_version=4, share=0.1, salt='a'); "
        "keys = [f'actor-{i}/episode-{j}' for i in range(100) for j in range(200)][:300]; "
        "print(','.join(str(p.version_for(k, random.Random())[0]) for k in keys))"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345"}, cwd=ROOT,
    ).stdout.strip()  # fmt: skip
    assert [int(v) for v in there.split(",")] == here


@pytest.mark.parametrize("share", [0.05, 0.1, 0.5])
def test_the_canary_gets_its_share_of_keys(share: float) -> None:
    plan = CanaryPlan("cartpole", 3, 4, share, salt="b")
    rng = random.Random(0)
    on_canary = sum(plan.version_for(key, rng)[0] == 4 for key in KEYS) / len(KEYS)
    spread = 4 * (share * (1 - share) / len(KEYS)) ** 0.5  # four standard errors
    assert abs(on_canary - share) < spread


def test_a_new_canary_draws_another_share_of_keys() -> None:
    again = CanaryPlan("cartpole", 3, 4, 0.1, salt="another")
    rng = random.Random(0)
    first = {k for k in KEYS if PLAN.version_for(k, rng)[0] == 4}
    second = {k for k in KEYS if again.version_for(k, rng)[0] == 4}
    overlap = len(first & second) / len(first)
    assert overlap < 0.2  # independent draws of 10% overlap by about 10%


def test_calls_without_a_key_are_drawn_one_by_one_and_said_so() -> None:
    rng = random.Random(7)
    drawn = [PLAN.version_for(None, rng) for _ in range(20_000)]
    assert {how for _, how in drawn} == {Assignment.UNKEYED}
    share = sum(version == 4 for version, _ in drawn) / len(drawn)
    assert abs(share - 0.1) < 4 * (0.1 * 0.9 / len(drawn)) ** 0.5


@pytest.mark.parametrize(
    ("share", "canary", "words"), [(0.0, 4, "share"), (1.0, 4, "share"), (0.1, 3, "live version")]
)
def test_a_plan_that_cannot_hold_is_refused(share: float, canary: int, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        CanaryPlan("cartpole", 3, canary, share)
