"""The steps of a call to a model of rows, in order, once, for every frontend.

The JSON predict routes (``serve.frontends.predict.http``), the Open Inference Protocol over REST
and gRPC (``serve.frontends.oip``) each decode their wire format and encode the answer;
between the two, every call takes these steps, written here only:

1. **deadline**: the route's default budget or less, as the call asks, from
   :attr:`RowCalls.turn` (``serve.dataplane.deadline``: one rule, the loop's lag counted
   for every transport);
2. **admit**: refused before any work in proportion to the call when its deadline passed
   (504) or the queue could not serve it in time (429); asked once per call;
3. **prepare**: the frontend's decoding and the version's validation, on the event loop
   when the call is small, on a worker thread when it is large (more than
   ``INLINE_BODY_BYTES`` of JSON body or tensors' data), so no call holds the
   loop in proportion to its size;
4. **submit**: never queued once its deadline passed; a step of server-held sequences
   (a recurrent policy's ``sequence_id``) is fed its memory from the model's sequence table
   and pinned to their version, and its next state is kept there; the scheduler answers it
   with the version that computed it, for the frontend to stamp (``http_calls.stamp``).

Errors are raised as ``RLServeError`` for the frontend's error path; the record of every
executed batch is the scheduler's (``serve.batching.batch_run``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import Enum
from typing import TypeVar

from serve.dataplane.deadline import Deadline, LoopTurn
from serve.dataplane.messages import InferenceResponse, Prepared, SequenceStep
from serve.dataplane.routing import Route

T = TypeVar("T")
# Calls up to this size are decoded and validated on the event loop (a few milliseconds
# at most); larger ones on a worker thread, so no request holds the loop in proportion to
# its size. An image observation (4x84x84 as JSON) is about 100 KB.
INLINE_BODY_BYTES = 256 * 1024
STATE = "state"  # a recurrent policy's answer: its next memory


class PreparedOn(Enum):
    """Where a call is prepared: work that keeps state per thread needs to know."""

    LOOP = "loop"
    THREAD = "thread"


class RowCalls:
    """The steps every frontend's row call takes after its deadline (``turn.deadline``)."""

    def __init__(self, turn: LoopTurn) -> None:
        self.turn = turn  # how long a turn of the event loop takes now: deadlines count it

    @staticmethod
    def admit(route: Route, deadline: Deadline, *, spent_on: str) -> None:
        """Step 2: DeadlineExceeded when the deadline passed while ``spent_on`` (never 429),
        QueueFull when the rows ahead could not be served in time."""
        deadline.check(spent_on)
        route.scheduler.admit(1, deadline.at)

    @staticmethod
    async def prepare(size: int, work: Callable[[PreparedOn], T]) -> T:
        """Step 3: ``work`` on the loop for a call of ``size`` bytes up to INLINE_BODY_BYTES,
        else on a worker thread."""
        if size <= INLINE_BODY_BYTES:
            return work(PreparedOn.LOOP)
        return await asyncio.to_thread(work, PreparedOn.THREAD)

    @staticmethod
    async def submit(route: Route, prepared: Prepared, deadline: Deadline) -> InferenceResponse:
        """Step 4: queue the prepared rows unless the deadline passed meanwhile."""
        deadline.check("validating it")
        if prepared.sequence is None:
            return await route.row_scheduler().submit(prepared, route.pinned)
        return await _sequence_step(route, prepared, prepared.sequence)

    @staticmethod
    def queue(
        route: Route, prepared: Prepared, deadline: Deadline
    ) -> asyncio.Future[InferenceResponse]:
        """Step 4 for a caller that does not await (the HTTP protocol's task-free answers):
        its answer's future. A step of server-held sequences has its memory fed and kept
        in a task of its own."""
        if prepared.sequence is not None:
            return asyncio.ensure_future(RowCalls.submit(route, prepared, deadline))
        deadline.check("validating it")
        return route.row_scheduler().submit(prepared, route.pinned)


async def _sequence_step(route: Route, prepared: Prepared, step: SequenceStep) -> InferenceResponse:
    """A step of server-held sequences: their memory in, their next memory kept, and the
    state left out of the answer (the server holds it)."""
    table = route.sequences
    assert table is not None, "row models hold sequences"
    held = table.begin(step, step.state_size)
    prepared.feeds[step.state_input] = held.state
    prepared.feeds[step.start_input] = step.starts
    version = route.pinned if held.version is None else held.version
    try:
        response = await route.row_scheduler().submit(prepared, version)
    except BaseException:
        table.abort(step)
        raise
    table.commit(step, response.outputs.pop(STATE), response.version)
    return response
