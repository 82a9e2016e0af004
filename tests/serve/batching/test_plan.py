"""The batch-forming rules, as a pure function of queue, clock and limits."""

import pytest

from serve.batching.plan import (
    COMPANY_TURNS,
    COMPANY_WAIT_S,
    COMPANY_WINDOW_S,
    Backlog,
    BatchLimits,
    DrainRate,
    Plan,
    Refused,
    RunTimes,
    Waiting,
    admission,
    admission_wait_s,
    bucket,
    buckets_for,
    company_turns,
    plan,
)

LIMITS = BatchLimits(max_batch_size=8, max_wait_s=0.002)
NO_WAIT = BatchLimits(max_batch_size=8, max_wait_s=0.0)


def waiting(rows: int, at: float = 0.0, deadline: float = 1.0) -> Waiting:
    return Waiting(rows=rows, enqueued_at=at, deadline=deadline)


def test_buckets_are_powers_of_two_capped_by_the_max_batch_size() -> None:
    assert buckets_for(8) == (1, 2, 4, 8)
    assert buckets_for(12) == (1, 2, 4, 8, 12)
    assert buckets_for(1) == (1,)


def test_a_batch_is_padded_to_the_smallest_bucket_that_holds_it() -> None:
    assert [bucket(r, (1, 2, 4, 8, 12)) for r in (1, 2, 3, 5, 9, 12)] == [1, 2, 4, 8, 12, 12]


def test_a_lone_request_waits_for_company_until_max_wait() -> None:
    decision = plan([waiting(1, at=0.0)], now=0.0005, limits=LIMITS, expected_run_s=0.0)
    assert decision.take == ()
    assert abs(decision.wait_s - 0.0015) < 1e-9


def test_a_lone_request_goes_once_max_wait_has_passed() -> None:
    decision = plan([waiting(1, at=0.0)], now=0.002, limits=LIMITS, expected_run_s=0.0)
    assert decision == Plan(expired=(), take=(0,), wait_s=0.0)


def test_a_full_batch_goes_at_once() -> None:
    queue = [waiting(4), waiting(4)]
    assert plan(queue, now=0.0, limits=LIMITS, expected_run_s=0.0).take == (0, 1)


def test_rows_are_gathered_in_order_and_the_first_that_does_not_fit_closes_the_batch() -> None:
    queue = [waiting(3), waiting(3), waiting(3), waiting(1)]
    decision = plan(queue, now=0.0, limits=LIMITS, expected_run_s=0.0)
    assert decision.take == (0, 1)  # never reordered to squeeze the 1-row request in


def test_expired_requests_are_dropped_without_running() -> None:
    queue = [waiting(2, deadline=0.001), waiting(2, deadline=1.0)]
    decision = plan(queue, now=0.003, limits=LIMITS, expected_run_s=0.0)
    assert decision.expired == (0,)
    assert decision.take == (1,)


def test_a_batch_goes_early_when_waiting_would_miss_a_deadline() -> None:
    queue = [waiting(1, at=0.0, deadline=0.0015)]
    decision = plan(queue, now=0.001, limits=LIMITS, expected_run_s=0.0006)
    assert decision.take == (0,)


def test_the_wait_ends_before_the_tightest_deadline_minus_the_expected_run_time() -> None:
    queue = [waiting(1, at=0.0, deadline=0.0018)]
    decision = plan(queue, now=0.0, limits=LIMITS, expected_run_s=0.0003)
    assert abs(decision.wait_s - 0.0015) < 1e-9


def test_an_empty_queue_plans_nothing() -> None:
    assert plan([], now=0.0, limits=LIMITS, expected_run_s=0.0) == Plan((), (), 0.0)


def test_without_max_wait_a_lone_request_goes_at_once() -> None:
    decision = plan([waiting(1, at=0.0)], now=0.0, limits=NO_WAIT, expected_run_s=0.001)
    assert decision == Plan(expired=(), take=(0,), wait_s=0.0)


def test_an_arrival_just_after_a_batch_of_several_rows_is_planned_turns_later() -> None:
    assert COMPANY_TURNS > 1
    assert company_turns(8, since_answered_s=0.0003, slack_s=1.0) == COMPANY_TURNS


def test_a_lone_caller_an_idle_model_and_a_tight_deadline_are_planned_in_the_next_turn() -> None:
    assert company_turns(1, since_answered_s=0.0003, slack_s=1.0) == 1  # batches of one row
    assert company_turns(8, since_answered_s=COMPANY_WINDOW_S, slack_s=1.0) == 1
    assert company_turns(0, since_answered_s=float("inf"), slack_s=1.0) == 1  # never ran
    assert company_turns(8, since_answered_s=0.0003, slack_s=COMPANY_WAIT_S / 2) == 1


def test_a_batch_never_mixes_versions() -> None:
    queue = [Waiting(1, 0.0, 1.0, version=1), Waiting(1, 0.0, 1.0, version=2)]
    assert plan(queue, now=0.0, limits=NO_WAIT, expected_run_s=0.0).take == (0,)


def test_another_versions_calls_wait_their_turn_without_cutting_the_batch_short() -> None:
    """A canary's calls interleave with the live version's: the batch of the head's version
    gathers past them, in order, and the first of them heads the next batch."""
    versions = [1, 2, 1, 1, 2, 1]
    queue = [Waiting(1, i / 10, 20.0, version=v) for i, v in enumerate(versions)]
    first = plan(queue, now=10.0, limits=NO_WAIT, expected_run_s=0.0)
    assert first.take == (0, 2, 3, 5)
    rest = [w for i, w in enumerate(queue) if i not in first.take]
    assert plan(rest, now=10.0, limits=NO_WAIT, expected_run_s=0.0).take == (0, 1)
    full = plan(queue, now=10.0, limits=BatchLimits(3, 0.0), expected_run_s=0.0)
    assert full.take == (0, 2, 3)


def test_batches_run_inline_while_their_size_measured_cheap() -> None:
    times = RunTimes(inline_below_s=0.001, window=3)
    assert times.next_inline(32)  # nothing measured yet
    for _ in range(3):
        times.add(1, 0.0001, inline=True)
        times.add(32, 0.005, inline=True)
    assert times.inline(1)
    assert not times.inline(32)
    assert times.inline(4)  # a size class never measured runs inline, and is measured


def test_one_slow_run_does_not_move_a_size_off_the_loop() -> None:
    times = RunTimes(inline_below_s=0.001, window=5)
    for run_s in (0.0002, 0.0002, 0.05, 0.0002):  # a pause in the middle
        times.add(8, run_s, inline=True)
    assert times.inline(8)


def test_thread_runs_do_not_count_and_probes_back_off() -> None:
    times = RunTimes(inline_below_s=0.001, window=1, first_probe=2, last_probe=8)
    times.add(16, 0.005, inline=True)  # expensive: off the loop from now on
    times.add(16, 0.0001, inline=False)  # quick on the thread: says nothing about the loop
    decisions = [times.next_inline(16) for _ in range(16)]
    probes = [i for i, inline in enumerate(decisions) if inline]
    assert probes == [1, 5, 13]  # after 2, then 4, then 8 batches
    times.add(16, 0.0001, inline=True)  # a probe found it cheap again
    assert times.next_inline(16)


def test_an_inline_threshold_of_zero_keeps_every_batch_on_the_thread() -> None:
    times = RunTimes(inline_below_s=0.0, first_probe=1)
    assert not any(times.next_inline(1) for _ in range(5))


def test_admission_counts_the_rows_ahead_at_the_measured_drain_rate() -> None:
    assert admission_wait_s(0, 5, 0.01) == 0.0  # nothing ahead: always admitted
    assert admission_wait_s(8, 1, 0.01) == pytest.approx(0.09)


def test_the_drain_rate_counts_only_time_spent_on_a_backlog() -> None:
    rate = DrainRate(window_s=0.02, weight=0.5)
    rate.started(0.0, 4, backlogged=False)
    rate.started(5.0, 4, backlogged=False)  # the model idled in between: not draining
    assert rate.per_row(0.001) == 0.001  # nothing measured: the run time per row
    rate.started(5.010, 8, backlogged=True)  # 4 rows in 10 ms: the window is not full yet
    assert rate.seconds_per_row == 0.0
    rate.started(5.030, 8, backlogged=True)  # 12 rows in 30 ms
    assert rate.seconds_per_row == pytest.approx(0.0025)
    rate.started(5.050, 8, backlogged=True)
    rate.started(5.052, 8, backlogged=True)  # 16 rows in 22 ms, averaged in
    assert rate.seconds_per_row == pytest.approx((0.0025 + 0.022 / 16) / 2)


def test_admission_refuses_what_it_cannot_serve_and_says_why() -> None:
    backlog = Backlog(queued=40, running=8, max_queued=64)
    serving = {"serving": True, "held": False}
    assert admission(backlog, 4, 1.0, 0.001, **serving) is None  # 52 rows in 52 ms
    assert admission(backlog, 4, 0.050, 0.001, **serving) is Refused.LATE
    assert admission(backlog, 25, 1.0, 0.001, **serving) is Refused.FULL  # 65 of 64 queued
    assert admission(Backlog(0, 0, 64), 4, 0.0, 0.001, **serving) is None  # nothing ahead
    held = {"serving": True, "held": True}
    assert admission(backlog, 4, 0.050, 0.001, **held) is None  # waits for the resume
    assert admission(backlog, 25, 1.0, 0.001, **held) is Refused.FULL
    stopping = {"serving": False, "held": False}
    assert admission(Backlog(0, 0, 64), 1, 1.0, 0.001, **stopping) is Refused.STOPPED
