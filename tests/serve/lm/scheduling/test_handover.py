"""The hand-over between the event loop and the decoding thread, driven from one thread:
what a step boundary takes from the queue, and what a request the loop answered itself
becomes (never run while queued; leaving the batch once running)."""

from __future__ import annotations

import time

from serve.lm.messages import GenerationSpec
from serve.lm.scheduling.handover import Handover, Refusal, Request
from serve.lm.scheduling.state import Control
from serve.lm.scheduling.step_plan import Occupancy, StepLimits
from tests.serve.lm import fakes

LIMITS = StepLimits(max_sequences=2, max_batch_tokens=1000, max_prefill_tokens=1000)
IDLE = Occupancy(0, 0)


def request(id: int, timeout_s: float = 5.0, version: int | None = None) -> Request:
    now = time.monotonic()
    spec = GenerationSpec(
        "w1 w2", None, 4, None, None, None, None, (), "id", now, now + timeout_s
    )  # fmt: skip
    generation = fakes.language_model().prepare_generation(spec)
    return Request.of(id, generation, version, streamed=False)


def started() -> Handover:
    handover = Handover()
    handover.start(lambda: None)
    return handover


def test_a_step_boundary_takes_what_fits_in_arrival_order():
    handover = started()
    for id in range(3):
        handover.put(request(id))
    step = handover.next_step(IDLE, LIMITS)
    assert step is not None
    assert [r.id for r in step.joining] == [0, 1]  # max_sequences
    assert handover.queued == 1
    assert handover.status.step_since is not None


def test_a_held_or_idle_handover_gives_no_step():
    handover = started()
    assert handover.next_step(IDLE, LIMITS) is None  # nothing queued, nothing running
    handover.control(Control.HOLD)
    handover.put(request(0))
    assert handover.next_step(IDLE, LIMITS) is None
    handover.control(Control.RESUME)
    assert handover.next_step(IDLE, LIMITS) is not None


def test_a_request_withdrawn_while_queued_never_runs():
    handover = started()
    handover.put(request(0))
    handover.put(request(1))
    assert handover.withdraw([0]) == {0}
    step = handover.next_step(IDLE, LIMITS)
    assert step is not None
    assert [r.id for r in step.joining] == [1]
    assert step.gone == frozenset()


def test_a_request_withdrawn_while_running_leaves_at_the_next_boundary():
    handover = started()
    handover.put(request(0))
    assert handover.next_step(IDLE, LIMITS) is not None
    assert handover.withdraw([0]) == set()  # it ran
    step = handover.next_step(Occupancy(1, 100), LIMITS)
    assert step is not None
    assert step.gone == frozenset({0})
    again = handover.next_step(Occupancy(1, 100), LIMITS)
    assert again is not None
    assert again.gone == frozenset()  # said once


def test_a_request_a_boundary_found_past_its_deadline_never_ran_when_the_loop_answers_it():
    handover = started()
    handover.put(request(0, timeout_s=-1.0))
    step = handover.next_step(IDLE, LIMITS)
    assert step is not None
    assert step.joining == []
    assert handover.queued == 0
    assert handover.withdraw([0]) == {0}


def test_a_draining_swap_pins_queued_requests_and_their_versions_stay_pinned():
    handover = started()
    handover.put(request(0))
    handover.put(request(1, version=3))
    handover.pin_queued(2)
    assert handover.pinned_versions() == {2, 3}


def test_admission_refuses_before_start_after_stop_and_beyond_the_queue():
    handover = Handover()
    assert handover.refusal(1, 1) is Refusal.STOPPED
    handover.start(lambda: None)
    assert handover.refusal(1, 1) is None
    handover.put(request(0))
    assert handover.refusal(1, 1) is Refusal.FULL
    handover.control(Control.STOP)
    assert handover.refusal(1, 1) is Refusal.STOPPED
