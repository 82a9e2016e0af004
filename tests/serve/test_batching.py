"""The batch-forming policy, as a pure function of queue, clock and policy."""

from serve.dataplane.batching import Plan, Policy, Waiting, bucket, buckets_for, plan

POLICY = Policy(max_batch_size=8, max_wait_s=0.002, buckets=buckets_for(8))


def waiting(rows: int, at: float = 0.0, deadline: float = 1.0) -> Waiting:
    return Waiting(rows=rows, enqueued_at=at, deadline=deadline)


def test_buckets_are_powers_of_two_capped_by_the_max_batch_size() -> None:
    assert buckets_for(8) == (1, 2, 4, 8)
    assert buckets_for(12) == (1, 2, 4, 8, 12)
    assert buckets_for(1) == (1,)


def test_a_batch_is_padded_to_the_smallest_bucket_that_holds_it() -> None:
    assert [bucket(r, (1, 2, 4, 8, 12)) for r in (1, 2, 3, 5, 9, 12)] == [1, 2, 4, 8, 12, 12]


def test_a_lone_request_waits_for_company_until_max_wait() -> None:
    decision = plan([waiting(1, at=0.0)], now=0.0005, policy=POLICY, expected_run_s=0.0)
    assert decision.take == ()
    assert abs(decision.wait_s - 0.0015) < 1e-9


def test_a_lone_request_goes_once_max_wait_has_passed() -> None:
    decision = plan([waiting(1, at=0.0)], now=0.002, policy=POLICY, expected_run_s=0.0)
    assert decision == Plan(expired=(), take=(0,), padded_rows=1, wait_s=0.0)


def test_a_full_batch_goes_at_once() -> None:
    queue = [waiting(4), waiting(4)]
    assert plan(queue, now=0.0, policy=POLICY, expected_run_s=0.0).take == (0, 1)


def test_rows_are_gathered_in_order_and_the_first_that_does_not_fit_closes_the_batch() -> None:
    queue = [waiting(3), waiting(3), waiting(3), waiting(1)]
    decision = plan(queue, now=0.0, policy=POLICY, expected_run_s=0.0)
    assert decision.take == (0, 1)  # never reordered to squeeze the 1-row request in
    assert decision.padded_rows == 8


def test_expired_requests_are_dropped_without_running() -> None:
    queue = [waiting(2, deadline=0.001), waiting(2, deadline=1.0)]
    decision = plan(queue, now=0.003, policy=POLICY, expected_run_s=0.0)
    assert decision.expired == (0,)
    assert decision.take == (1,)


def test_a_batch_goes_early_when_waiting_would_miss_a_deadline() -> None:
    queue = [waiting(1, at=0.0, deadline=0.0015)]
    decision = plan(queue, now=0.001, policy=POLICY, expected_run_s=0.0006)
    assert decision.take == (0,)


def test_the_wait_ends_before_the_tightest_deadline_minus_the_expected_run_time() -> None:
    queue = [waiting(1, at=0.0, deadline=0.0018)]
    decision = plan(queue, now=0.0, policy=POLICY, expected_run_s=0.0003)
    assert abs(decision.wait_s - 0.0015) < 1e-9


def test_an_empty_queue_plans_nothing() -> None:
    assert plan([], now=0.0, policy=POLICY, expected_run_s=0.0) == Plan((), (), 0, 0.0)
