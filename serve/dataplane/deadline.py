"""A call's deadline: one value, one rule, for every transport and model kind.

A call's budget is the route's default (``default_deadline_ms``, or
``generation_deadline_ms`` for a generation), or less when the call asks for less: the
``X-Request-Timeout-Ms`` header, a gRPC deadline, the Open Inference Protocol's ``timeout``
parameter. Its deadline is that budget from when its bytes arrived, less the turns of the
event loop its answer spends where the server cannot see it (unread, then its handler
scheduled; its answer written: :data:`LAG_TURNS`), so that an overloaded loop does not
answer late what it accepted in time.

A passed deadline is answered :class:`~kernel.errors.DeadlineExceeded` (504,
DEADLINE_EXCEEDED) whenever it is found, before admission too: never as a full queue.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kernel.errors import DeadlineExceeded

# Turns of the event loop a request spends unseen: unread (up to one), its handler
# scheduled (one), its answer written (one). Negligible unless the loop is overloaded.
LAG_TURNS = 3


class LoopTurn:
    """How long a turn of the event loop takes now: sampled by the process
    (``serve.process.app``), read by every frontend's deadlines alike."""

    __slots__ = ("seconds",)
    WEIGHT = 0.3  # of each new sample in the moving average

    def __init__(self) -> None:
        self.seconds = 0.0

    def observe(self, sample_s: float) -> None:
        self.seconds = self.WEIGHT * sample_s + (1 - self.WEIGHT) * self.seconds

    def deadline(self, received_at: float, budget_ms: float) -> Deadline:
        """The deadline of a call whose bytes arrived at ``received_at``, as the loop turns
        now."""
        return Deadline.start(received_at, budget_ms, self.seconds)


def budget_ms(default_ms: float, *asked_ms: float | None) -> float:
    """The budget: the default, or the least that the call asks for, if less."""
    return min((default_ms, *(asked for asked in asked_ms if asked is not None)))


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a call must be answered by (monotonic seconds) and the budget it was given."""

    at: float
    budget_ms: float

    @classmethod
    def start(cls, received_at: float, budget_ms: float, turn_s: float) -> Deadline:
        """The deadline of a call whose bytes arrived at ``received_at``, the loop turning
        once every ``turn_s`` seconds now."""
        return cls(received_at + budget_ms / 1000 - LAG_TURNS * turn_s, budget_ms)

    def check(self, spent_on: str) -> None:
        """DeadlineExceeded once the deadline has passed, saying what the call was doing."""
        if time.monotonic() >= self.at:
            raise DeadlineExceeded(
                f"the request's deadline of {self.budget_ms:g} ms passed while {spent_on}; "
                "it was not run"
            )
