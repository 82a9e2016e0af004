"""The lane scenario's verdicts (bench/targets.py), from records made here: the one
actor's share of onnxruntime's batch-1 rate is judged against the floors of its own run."""

from __future__ import annotations

from bench import lane, targets
from bench.lane import Floors, LaneRow, LaneRun, Load, Transport


def lane_run(one_actor: float | None, floors: Floors | None) -> LaneRun:
    rows = (
        LaneRow(Load.ONE_ACTOR, Transport.HTTP, 2_500.0, None, 1.0, 10_000),
        LaneRow(Load.ONE_ACTOR, Transport.LANE, one_actor, None, 1.0, 50_000),
    )
    return LaneRun(
        "2026-12-07 12:00 UTC", 60.0, 5.0, 2.0, "x86_64", "0.1", "0.2", 1_700_000.0, rows,
        None, floors,
    )  # fmt: skip


def share(run: LaneRun) -> targets.Verdict:
    return next(v for v in targets.lane_verdicts(run) if "of onnxruntime's" in v.target)


def test_the_one_actor_share_is_judged_against_onnxruntime_alone_in_the_same_run() -> None:
    floors = Floors(80_000.0, 28_000.0, 86_000.0)
    met = share(lane_run(12_000.0, floors))
    assert met.met is True
    assert met.measured.startswith("15.0%: 12,000 against 80,000 rows/s")
    assert "43% of a bare shared-memory round trip's rate (28,000/s, 86,000/s spinning)" in (
        met.measured
    )
    assert share(lane_run(11_900.0, floors)).met is False
    assert f"≥ {lane.MIN_ONE_ACTOR_SHARE:.0%}" in met.target


def test_the_share_is_not_judged_without_the_floors_or_the_actor() -> None:
    assert share(lane_run(12_000.0, None)).met is None
    failed = share(lane_run(None, Floors(80_000.0, None, None)))
    assert (failed.met, failed.measured) == (None, "the one-actor row failed")
