"""What a continuous-batching scheduler is doing, and how that changes: one enum of states
and the transitions, written once.

A scheduler is NEW until it is started on an event loop, then RUNNING. HELD admits
requests but runs no step (queued and running requests wait within their deadlines) until
resumed. STOPPING refuses new requests and decodes everything admitted to its end (a hold
no longer counts); once nothing is left the decoding thread makes it STOPPED. Any other
pair of state and control leaves the state as it is (holding a held scheduler, resuming a
running one, holding or resuming one that stops).
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Control", "SchedulerState", "transition"]


class SchedulerState(Enum):
    NEW = "new"
    RUNNING = "running"
    HELD = "held"
    STOPPING = "stopping"
    STOPPED = "stopped"

    @property
    def admits(self) -> bool:
        """New requests are queued (else refused: 503)."""
        return self in _ADMITTING

    @property
    def steps(self) -> bool:
        """The decoding thread runs steps while there is work."""
        return self in _STEPPING


class Control(Enum):
    START = "start"  # on the event loop, once
    HOLD = "hold"
    RESUME = "resume"
    STOP = "stop"
    DRAINED = "drained"  # the decoding thread, stopping, has nothing left


_ADMITTING = frozenset({SchedulerState.RUNNING, SchedulerState.HELD})
_STEPPING = frozenset({SchedulerState.RUNNING, SchedulerState.STOPPING})

_TRANSITIONS: dict[tuple[SchedulerState, Control], SchedulerState] = {
    (SchedulerState.NEW, Control.START): SchedulerState.RUNNING,
    (SchedulerState.NEW, Control.STOP): SchedulerState.STOPPED,  # never started: no thread
    (SchedulerState.RUNNING, Control.HOLD): SchedulerState.HELD,
    (SchedulerState.HELD, Control.RESUME): SchedulerState.RUNNING,
    (SchedulerState.RUNNING, Control.STOP): SchedulerState.STOPPING,
    (SchedulerState.HELD, Control.STOP): SchedulerState.STOPPING,
    (SchedulerState.STOPPING, Control.DRAINED): SchedulerState.STOPPED,
}


def transition(state: SchedulerState, control: Control) -> SchedulerState:
    return _TRANSITIONS.get((state, control), state)
