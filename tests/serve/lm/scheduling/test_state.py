"""The scheduler's states and transitions (a pure table, no thread)."""

from __future__ import annotations

import pytest

from serve.lm.scheduling.state import Control, SchedulerState, transition

NEW, RUNNING, HELD = SchedulerState.NEW, SchedulerState.RUNNING, SchedulerState.HELD
STOPPING, STOPPED = SchedulerState.STOPPING, SchedulerState.STOPPED


def test_a_scheduler_runs_holds_resumes_and_drains_to_its_stop():
    state = NEW
    visited = []
    for control in (Control.START, Control.HOLD, Control.RESUME, Control.STOP, Control.DRAINED):
        state = transition(state, control)
        visited.append(state)
    assert visited == [RUNNING, HELD, RUNNING, STOPPING, STOPPED]


@pytest.mark.parametrize(
    ("state", "control"),
    [
        (STOPPING, Control.HOLD),  # a hold no longer counts once stopping
        (STOPPING, Control.RESUME),
        (HELD, Control.HOLD),
        (RUNNING, Control.RESUME),
        (RUNNING, Control.DRAINED),  # only a stopping scheduler drains
        (STOPPED, Control.START),  # stopped for good
    ],
)
def test_other_controls_leave_the_state_as_it_is(state, control):
    assert transition(state, control) is state


def test_a_scheduler_never_started_stops_at_once():
    assert transition(NEW, Control.STOP) is STOPPED


def test_only_a_running_or_held_scheduler_admits_and_a_held_one_runs_no_step():
    assert [s for s in SchedulerState if s.admits] == [RUNNING, HELD]
    assert [s for s in SchedulerState if s.steps] == [RUNNING, STOPPING]
