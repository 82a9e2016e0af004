"""A canary's assignment of episodes to versions (serve/control/canary_assignment.py):
sticky per key in every process, the stated share of keys, a new draw per canary, the
same draw whichever version is live, and a plan that survives its record."""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from serve.control.canary_assignment import Arm, Assignment, CanaryPlan
from serve.control.return_gate import GateSettings
from serve.types import GateAction

ROOT = Path(__file__).resolve().parents[3]
PLAN = CanaryPlan("cartpole", version=4, share=0.1, salt="a")
KEYS = [f"actor-{i}/episode-{j}" for i in range(100) for j in range(200)]


def test_a_key_gets_the_same_version_every_time() -> None:
    rng = random.Random(0)
    for key in KEYS[:500]:
        first = PLAN.arm_for(key, rng)
        assert all(PLAN.arm_for(key, rng) == first for _ in range(5))
        assert first[1] is Assignment.KEYED


def test_another_process_assigns_every_key_alike() -> None:
    """Workers and restarts agree: the hash holds nothing of the process (no seeded hash)."""
    rng = random.Random(0)
    here = [PLAN.arm_for(key, rng)[0].value for key in KEYS[:300]]
    code = (
        "import random; from serve.control.canary_assignment import CanaryPlan; "
        "p = CanaryPlan('cartpole', version=4, share=0.1, salt='a'); "
        "keys = [f'actor-{i}/episode-{j}' for i in range(100) for j in range(200)][:300]; "
        "print(','.join(p.arm_for(k, random.Random())[0].value for k in keys))"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345"}, cwd=ROOT,
    ).stdout.strip()  # fmt: skip
    assert there.split(",") == here


@pytest.mark.parametrize("share", [0.05, 0.1, 0.5])
def test_the_canary_gets_its_share_of_keys(share: float) -> None:
    plan = CanaryPlan("cartpole", 4, share, salt="b")
    rng = random.Random(0)
    on_canary = sum(plan.arm_for(key, rng)[0] is Arm.CANARY for key in KEYS) / len(KEYS)
    spread = 4 * (share * (1 - share) / len(KEYS)) ** 0.5  # four standard errors
    assert abs(on_canary - share) < spread


def test_a_new_canary_draws_another_share_of_keys() -> None:
    again = CanaryPlan("cartpole", 4, 0.1, salt="another")
    rng = random.Random(0)
    first = {k for k in KEYS if PLAN.arm_for(k, rng)[0] is Arm.CANARY}
    second = {k for k in KEYS if again.arm_for(k, rng)[0] is Arm.CANARY}
    overlap = len(first & second) / len(first)
    assert overlap < 0.2  # independent draws of 10% overlap by about 10%


def test_calls_without_a_key_are_drawn_one_by_one_and_said_so() -> None:
    rng = random.Random(7)
    drawn = [PLAN.arm_for(None, rng) for _ in range(20_000)]
    assert {how for _, how in drawn} == {Assignment.UNKEYED}
    share = sum(arm is Arm.CANARY for arm, _ in drawn) / len(drawn)
    assert abs(share - 0.1) < 4 * (0.1 * 0.9 / len(drawn)) ** 0.5


def test_the_draw_holds_nothing_of_the_live_version() -> None:
    """A live push during a canary must not move a canary episode: the hash names the
    canary's version and salt, never the live one."""
    assert "live" not in {f.name for f in dataclasses.fields(CanaryPlan)}


def test_a_recorded_plan_reads_back_the_same() -> None:
    plan = CanaryPlan("cartpole", 4, 0.25, "s", GateSettings(margin=2.0), GateAction.AUTO, 5.0)
    again = CanaryPlan.from_json(orjson.loads(orjson.dumps(plan.to_json())))
    assert again == plan
    assert again.arm_for("k", random.Random()) == plan.arm_for("k", random.Random())


@pytest.mark.parametrize("share", [0.0, 1.0, -0.5, 2.0])
def test_a_share_that_is_not_a_fraction_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="share"):
        CanaryPlan("cartpole", 4, share)
