"""One batch of the dynamic batch scheduler, run and delivered.

:func:`execute` stacks a batch's rows and runs the model once (inline on the event loop or
on the scheduler's thread); when the batch fails it runs each request alone, so that only
the request that breaks the model fails. :func:`deliver`, back on the event loop, turns
each run into one :class:`~serve.batching.record.BatchRecord`, cuts every request's answer
from it and hands it to every record sink.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from kernel.errors import RLServeError, one_line
from serve.batching.record import BatchRecord, RecordSink
from serve.batching.row_queue import Ticket
from serve.dataplane.messages import InferenceResponse, Prepared
from serve.dataplane.model import ServedModel, as_rows
from serve.types import Outputs

log = logging.getLogger("rlserve.scheduler")


# Run and Execution are made for every batch, a lone request's included: slotted, not
# frozen (a frozen dataclass pays an object.__setattr__ per field).


@dataclass(slots=True)
class Run:
    """What executing a group of requests produced: outputs, or the exception it raised."""

    requests: list[Ticket]
    inputs: dict[str, np.ndarray]  # every row, unpadded
    outputs: Outputs | Exception


@dataclass(slots=True)
class Execution:
    """A batch's runs and how long they took, measured on the thread that ran them."""

    model: ServedModel
    runs: list[Run]
    rows: int
    started: float  # monotonic seconds
    finished: float
    inline: bool  # it ran on the event loop


def execute(model: ServedModel, batch: list[Ticket], rows: int, inline: bool) -> Execution:
    started = time.monotonic()
    runs = _runs(model, batch)
    return Execution(model, runs, rows, started, time.monotonic(), inline)


def lost(model: ServedModel, batch: list[Ticket], rows: int) -> Execution:
    """A batch whose thread stopped before it ran: every request fails."""
    now = time.monotonic()
    failed = Run(batch, {}, RuntimeError("the batch thread stopped"))
    return Execution(model, [failed], rows, now, now, inline=False)


def _runs(model: ServedModel, batch: list[Ticket]) -> list[Run]:
    requests = [t.prepared for t in batch]
    inputs = stacked(requests)
    try:
        return [Run(batch, inputs, as_rows(model).execute(inputs, requests))]
    except Exception as exc:
        if len(batch) == 1:
            return [Run(batch, inputs, exc)]
    return [run for one in batch for run in _runs(model, [one])]


def stacked(requests: list[Prepared]) -> dict[str, np.ndarray]:
    """Every request's rows, one array per input (no copy for a request alone)."""
    if len(requests) == 1:
        return requests[0].feeds
    return {name: np.concatenate([p.feeds[name] for p in requests]) for name in requests[0].feeds}


def deliver(execution: Execution, sinks: Sequence[RecordSink], max_rows: int) -> None:
    """Answer every request of an executed batch, and publish each run's record."""
    model = execution.model
    span = (execution.started, execution.finished)
    for run in execution.runs:
        if isinstance(run.outputs, Exception):
            _fail(model, run.requests, run.outputs)
            continue
        record = _record(model, run, run.outputs, span, max_rows)
        _answer(model, record, run.requests)
        publish(record, sinks)


def _record(
    model: ServedModel,
    run: Run,
    outputs: Outputs,
    span: tuple[float, float],
    max_rows: int,
) -> BatchRecord:
    tickets = run.requests
    requests = [t.prepared for t in tickets]
    enqueued_at = [t.enqueued_at for t in tickets]
    return batch_record(model, requests, enqueued_at, run.inputs, outputs, span, max_rows)


def batch_record(
    model: ServedModel,
    requests: Sequence[Prepared],
    enqueued_at: Sequence[float],
    inputs: dict[str, np.ndarray],
    outputs: Outputs,
    span: tuple[float, float],
    max_rows: int,
) -> BatchRecord:
    """The record of one run of ``requests`` (in row order), queued at ``enqueued_at``."""
    return BatchRecord(
        model=model.name,
        version=model.version,
        sha256=model.sha256,
        request_ids=tuple([p.request_id for p in requests]),
        requests=tuple(requests),
        offsets=(0, *accumulate([p.rows for p in requests])),
        inputs=inputs,
        outputs=outputs,
        received_at=tuple([p.received_at for p in requests]),
        enqueued_at=tuple(enqueued_at),
        started_at=span[0],
        finished_at=span[1],
        max_rows=max_rows,
    )


def _answer(model: ServedModel, record: BatchRecord, tickets: list[Ticket]) -> None:
    for ticket, start in zip(tickets, record.offsets, strict=False):
        try:
            outputs = as_rows(model).respond(ticket.prepared, record.outputs, start)
        except Exception as exc:  # a bug in respond(): this request learns of it
            log.exception("answering a request of %s failed", model.name)
            settle(ticket, RLServeError(f"internal error: {type(exc).__name__}"))
            continue
        response = InferenceResponse(
            model.name, model.version, model.sha256, outputs, ticket.prepared.single
        )
        settle(ticket, response)


def publish(record: BatchRecord, sinks: Sequence[RecordSink]) -> None:
    for sink in sinks:
        try:
            sink.accept(record)
        except Exception:
            log.exception("record sink %s failed on a batch of %s", sink, record.model)


def _fail(model: ServedModel, tickets: list[Ticket], exc: Exception) -> None:
    error = failure(model, exc)
    for ticket in tickets:
        settle(ticket, error)


def failure(model: ServedModel, exc: Exception) -> RLServeError:
    """What the requests of a run the model failed on are answered (the failure logged)."""
    log.error("model %s failed on a request: %s", model.name, one_line(exc))
    return RLServeError(f"model {model.name!r} failed on this input: {one_line(exc)}")


def settle(ticket: Ticket, outcome: InferenceResponse | RLServeError) -> None:
    if ticket.future.done():  # already answered: its deadline passed
        return
    if isinstance(outcome, RLServeError):
        ticket.future.set_exception(outcome)
    else:
        ticket.future.set_result(outcome)
