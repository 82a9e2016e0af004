"""Which waiting requests join the decoding batch: deadlines, arrival order, and the limits
in sequences, cache tokens and prefill tokens (plain numbers, no model)."""

from __future__ import annotations

from serve.lm.scheduling.step_plan import (
    Occupancy,
    StepLimits,
    Waiting,
    plan_step,
)

LIMITS = StepLimits(max_sequences=4, max_batch_tokens=1000, max_prefill_tokens=300)
IDLE = Occupancy(0, 0)


def generate(prompt: int = 10, new: int = 50, deadline: float = 10.0) -> Waiting:
    return Waiting(prompt, prompt + new, 1, deadline)


def score(tokens: int = 40, deadline: float = 10.0) -> Waiting:
    return Waiting(tokens, 0, 0, deadline)


def test_everything_that_fits_joins_in_arrival_order():
    plan = plan_step([generate(), generate(), score()], IDLE, 0.0, LIMITS)
    assert plan.join == (0, 1, 2)
    assert plan.expired == ()


def test_expired_requests_are_answered_and_the_rest_still_join():
    queue = [generate(deadline=1.0), generate(), generate(deadline=0.5)]
    plan = plan_step(queue, IDLE, 1.0, LIMITS)
    assert plan.expired == (0, 2)
    assert plan.join == (1,)


def test_sequences_are_capped_but_scorings_hold_no_sequence():
    running = Occupancy(3, 100)
    plan = plan_step([generate(), generate(), score()], running, 0.0, LIMITS)
    assert plan.join == (0,)  # the second would be a fifth sequence: it and all after wait
    full = Occupancy(4, 100)
    assert plan_step([score(), generate()], full, 0.0, LIMITS).join == (0,)


def test_the_cache_budget_counts_the_padded_rows_the_batch_may_come_to_hold():
    running = Occupancy(2, 300)  # two rows that may grow to 300 tokens each
    assert running.padded_tokens == 600
    assert plan_step([generate(10, 290)], running, 0.0, LIMITS).join == (0,)  # 3 x 300 = 900
    assert plan_step([generate(10, 324)], running, 0.0, LIMITS).join == ()  # 3 x 334 > 1000
    # A long newcomer pads every short row to its length: 4 x 300 = 1200, though the
    # reservations add up to 3 x 100 + 300 = 600.
    assert plan_step([generate(10, 290)], Occupancy(3, 100), 0.0, LIMITS).join == ()
    shorts = [generate(5, 95), generate(5, 95), generate(5, 255)]
    assert plan_step(shorts, Occupancy(1, 100), 0.0, LIMITS).join == (0, 1)  # 4 x 260 > 1000


def test_a_scoring_holds_no_cache_row():
    assert plan_step([score(900)], Occupancy(3, 300), 0.0, LIMITS).join == (0,)


def test_prefill_tokens_per_boundary_are_capped_after_the_first_newcomer():
    queue = [generate(250, 10), generate(100, 10), generate(20, 10)]
    assert plan_step(queue, Occupancy(1, 50), 0.0, LIMITS).join == (0,)
    huge = [generate(400, 10), generate(5, 5)]  # over the prefill cap alone: still joins
    assert plan_step(huge, Occupancy(1, 50), 0.0, LIMITS).join == (0,)


def test_no_request_overtakes_one_that_waits_for_room():
    queue = [generate(10, 500), generate(1, 1)]
    assert plan_step(queue, Occupancy(1, 600), 0.0, LIMITS).join == ()


def test_with_nothing_running_the_head_joins_whatever_its_size():
    queue = [generate(100, 5000), generate(1, 1)]
    plan = plan_step(queue, IDLE, 0.0, LIMITS)
    assert plan.join == (0,)  # alone: the next one waits for room


def test_a_groups_prompt_counts_once_in_the_prefill_budget():
    group = [Waiting(200, 240, 1, 10.0, prompt=7) for _ in range(4)]
    plan = plan_step([generate(prompt=50), *group], IDLE, 0.0, LIMITS)
    assert plan.join == (0, 1, 2, 3)  # 50 + 200 once; the fifth would pass max_sequences
    different = [Waiting(200, 240, 1, 10.0, prompt=p) for p in (7, 8)]
    assert plan_step([generate(prompt=50), *different], IDLE, 0.0, LIMITS).join == (0, 1)
