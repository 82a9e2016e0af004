"""The dynamic batch scheduler with a fake model: work-conserving batching, inline and
threaded runs, records, back-pressure, deadlines, isolation, versions, hold and stop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from kernel.errors import (
    DeadlineExceeded,
    InvalidInput,
    QueueFull,
    RLServeError,
    ServiceUnavailable,
)
from serve.batching import dynamic_batcher
from serve.batching.dynamic_batcher import DynamicBatchScheduler, Life, Phase
from serve.control.lifecycle import ModelLifeCycle
from serve.dataplane.messages import InferenceResponse
from serve.dataplane.model import as_rows
from serve.dataplane.scheduler import Load
from tests.serve.dataplane.fakes import (
    EchoModel,
    Records,
    lifecycle,
    request,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def submit(
    cycle: ModelLifeCycle, rows: Any, timeout_s: float = 1.0, version: int | None = None
) -> asyncio.Future[InferenceResponse]:
    model = cycle.active_model
    assert model is not None
    return rows_scheduler(cycle).submit(as_rows(model).prepare(request(rows, timeout_s)), version)


def rows_scheduler(cycle: ModelLifeCycle) -> DynamicBatchScheduler:
    assert isinstance(cycle.scheduler, DynamicBatchScheduler)
    return cycle.scheduler


async def answer(cycle: ModelLifeCycle, rows: Any, timeout_s: float = 1.0) -> Any:
    return (await submit(cycle, rows, timeout_s)).outputs


async def test_requests_of_one_turn_share_a_batch_and_get_their_own_rows_back() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=16)
    answers = await asyncio.gather(*(answer(cycle, [i, i + 0.5]) for i in range(6)))
    await cycle.scheduler.stop()
    assert answers == [{"y": [2 * i, 2 * i + 1]} for i in range(6)]
    assert model.batches == [12]


async def test_a_request_that_finds_the_model_idle_runs_at_once() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=16, max_wait_ms=0)
    started = time.monotonic()
    assert await answer(cycle, [1.0]) == {"y": [2.0]}
    assert time.monotonic() - started < 0.05  # no deliberate wait for company
    await cycle.scheduler.stop()


async def test_rows_arriving_while_a_batch_runs_form_the_next_batch() -> None:
    model = EchoModel(run_s=0.05)
    cycle = lifecycle(model, max_batch_size=16, inline_max_ms=0)  # always on the thread
    first = submit(cycle, [1.0])
    await asyncio.sleep(0.01)  # the first batch is running
    later = [submit(cycle, [float(i)]) for i in range(3)]
    await asyncio.gather(first, *later)
    await cycle.scheduler.stop()
    assert model.batches == [1, 3]


async def test_max_wait_is_an_opt_in_wait_for_fuller_batches() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=4, max_wait_ms=30)
    first = submit(cycle, [1.0])
    await asyncio.sleep(0.01)
    assert model.batches == []  # waiting for company
    second = submit(cycle, [2.0])
    await asyncio.gather(first, second)
    await cycle.scheduler.stop()
    assert model.batches == [2]


async def test_a_full_batch_does_not_wait_out_max_wait() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=2, max_wait_ms=10_000)
    first = submit(cycle, [1.0])
    await asyncio.sleep(0.005)
    await asyncio.wait_for(asyncio.gather(first, submit(cycle, [2.0])), 1)
    await cycle.scheduler.stop()
    assert model.batches == [2]


async def test_cheap_batches_run_on_the_event_loop_and_expensive_ones_on_a_thread() -> None:
    cheap, slow = EchoModel(), EchoModel(run_s=0.002)
    # an echo cannot take a second even on a loaded machine; a 2 ms sleep always passes 0.5 ms
    on_loop = lifecycle(cheap, inline_max_ms=1_000)
    off_loop = lifecycle(slow, inline_max_ms=0.5)
    for _ in range(3):
        await answer(on_loop, [1.0])
        await answer(off_loop, [1.0])
    await on_loop.scheduler.stop()
    await off_loop.scheduler.stop()
    loop_thread = threading.get_ident()
    assert set(cheap.threads) == {loop_thread}
    # measured, not assumed: the first batch runs inline, its run time moves the rest off
    assert slow.threads[0] == loop_thread
    assert loop_thread not in slow.threads[1:]


async def test_every_executed_batch_becomes_one_record_for_every_sink() -> None:
    model, records = EchoModel(), Records()
    cycle = lifecycle(model, sinks=[records])
    model_served = cycle.active_model
    assert model_served is not None
    futures = [
        rows_scheduler(cycle).submit(
            as_rows(model_served).prepare(request(rows, request_id=rid)), None
        )
        for rows, rid in (([1.0, 2.0], "a"), ([3.0], "b"))
    ]
    await asyncio.gather(*futures)
    await cycle.scheduler.stop()
    (record,) = records.records
    assert (record.model, record.version, record.sha256) == ("echo", 1, "0" * 64)
    assert record.request_ids == ("a", "b")
    assert record.offsets == (0, 2, 3)
    assert record.inputs["x"][:, 0].tolist() == [1.0, 2.0, 3.0]
    assert record.outputs["y"][:, 0].tolist() == [2.0, 4.0, 6.0]
    assert record.started_at <= record.finished_at
    arrivals = zip(record.received_at, record.enqueued_at, strict=True)
    assert all(r <= e <= record.started_at for r, e in arrivals)


async def test_a_failing_sink_does_not_touch_the_answers() -> None:
    class Broken:
        def accept(self, record: Any) -> None:
            raise RuntimeError("sink is down")

    records = Records()
    cycle = lifecycle(EchoModel(), sinks=[Broken(), records])
    assert await answer(cycle, [1.0]) == {"y": [2.0]}
    await cycle.scheduler.stop()
    assert len(records.records) == 1


async def test_a_full_queue_refuses_with_a_retry_hint() -> None:
    cycle = lifecycle(EchoModel(), max_batch_size=4, max_queue_rows=3)
    cycle.scheduler.hold()
    submit(cycle, [1, 2])
    with pytest.raises(QueueFull) as caught:
        submit(cycle, [3, 4])
    assert (caught.value.retry_after_s or 0) >= 1
    cycle.scheduler.resume()
    await cycle.scheduler.stop()


async def test_the_load_counts_queued_and_running_rows_and_requests() -> None:
    model = EchoModel(run_s=0.05)
    cycle = lifecycle(model, inline_max_ms=0)
    assert cycle.scheduler.load() == Load(0, 0, 0)
    running = submit(cycle, [1.0, 2.0])
    await asyncio.sleep(0.01)  # on the thread now
    queued = submit(cycle, [3.0])
    assert cycle.scheduler.load() == Load(queued_rows=1, pending_rows=3, requests=2)
    await asyncio.gather(running, queued)
    assert cycle.scheduler.load() == Load(0, 0, 0)
    await cycle.scheduler.stop()


async def test_a_request_whose_deadline_passes_in_the_queue_is_never_run() -> None:
    model = EchoModel()
    cycle = lifecycle(model)
    cycle.scheduler.hold()
    with pytest.raises(DeadlineExceeded, match="not run"):
        await answer(cycle, [1.0], timeout_s=0.02)
    cycle.scheduler.resume()
    await cycle.scheduler.stop()
    assert model.batches == []


async def test_a_request_whose_batch_outlives_its_deadline_gets_504_at_the_deadline() -> None:
    model = EchoModel(run_s=0.3)
    cycle = lifecycle(model, inline_max_ms=0)
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="no answer within"):
        await answer(cycle, [1.0], timeout_s=0.05)
    assert time.monotonic() - started < 0.2
    await cycle.scheduler.stop()


async def test_a_request_that_breaks_the_model_fails_alone() -> None:
    cycle = lifecycle(EchoModel(), max_batch_size=8)
    results = await asyncio.gather(
        answer(cycle, [1.0]), answer(cycle, [-1.0]), answer(cycle, [3.0]), return_exceptions=True
    )
    await cycle.scheduler.stop()
    assert results[0] == {"y": [2.0]}
    assert isinstance(results[1], RLServeError)
    assert "cannot take -1" in results[1].message
    assert results[2] == {"y": [6.0]}


async def test_stopping_answers_everything_still_queued_and_refuses_more() -> None:
    cycle = lifecycle(EchoModel(), max_batch_size=8, max_wait_ms=10_000)
    pending = [submit(cycle, [float(i)]) for i in range(3)]
    await cycle.scheduler.stop()
    assert [p.result().outputs for p in pending] == [{"y": [0.0]}, {"y": [2.0]}, {"y": [4.0]}]
    with pytest.raises(ServiceUnavailable):
        submit(cycle, [1.0])
    assert not cycle.scheduler.alive


async def test_stopping_runs_what_a_hold_kept_queued() -> None:
    cycle = lifecycle(EchoModel())
    cycle.scheduler.hold()
    held = submit(cycle, [1.0])
    await cycle.scheduler.stop()
    assert held.result().outputs == {"y": [2.0]}


async def test_requests_run_on_the_version_active_when_their_batch_forms() -> None:
    cycle = lifecycle(EchoModel(), EchoModel(version=2, factor=20))
    cycle.scheduler.hold()
    queued = submit(cycle, [1.0])
    cycle.activate(2)  # queued before the swap: runs on version 2
    cycle.scheduler.resume()
    response = await queued
    await cycle.scheduler.stop()
    assert (response.version, response.outputs) == (2, {"y": [20.0]})


async def test_pinned_requests_stay_on_their_version_and_never_share_a_batch() -> None:
    old_model, new_model = EchoModel(), EchoModel(version=2, factor=20)
    cycle = lifecycle(old_model, new_model)
    cycle.scheduler.hold()
    old = submit(cycle, [1.0])
    cycle.scheduler.pin_queued(1)  # a draining swap: what was queued stays on version 1
    assert cycle.scheduler.pinned_versions() == {1}
    cycle.activate(2)
    new = submit(cycle, [1.0])
    cycle.scheduler.resume()
    results = [await old, await new]
    await cycle.scheduler.stop()
    assert [(r.version, r.outputs) for r in results] == [(1, {"y": [2.0]}), (2, {"y": [20.0]})]
    assert (old_model.batches, new_model.batches) == ([1], [1])


async def test_a_batch_for_an_unloaded_version_is_refused_not_run() -> None:
    cycle = lifecycle(EchoModel(), EchoModel(version=2))
    cycle.scheduler.hold()
    pinned = submit(cycle, [1.0], version=2)
    cycle.evict(keep=1, protected=set())  # version 2 is gone
    cycle.scheduler.resume()
    with pytest.raises(ServiceUnavailable, match="unloaded"):
        await pinned
    await cycle.scheduler.stop()


async def test_a_held_scheduler_runs_nothing_until_resumed() -> None:
    model = EchoModel()
    cycle = lifecycle(model)
    cycle.scheduler.hold()
    waiting = submit(cycle, [2.0])
    await asyncio.sleep(0.02)
    assert model.batches == []
    cycle.scheduler.resume()
    assert (await waiting).outputs == {"y": [4.0]}
    await cycle.scheduler.stop()


async def test_the_scheduler_describes_its_settings_and_where_batches_run() -> None:
    cycle = lifecycle(EchoModel(), max_batch_size=8)
    described = cycle.scheduler.describe()
    await cycle.scheduler.stop()
    assert described["scheduler"] == "dynamic_batcher"
    assert (described["max_batch_size"], described["max_wait_ms"]) == (8, 0.0)
    assert described["runs_inline"] == dict.fromkeys(["1 rows", "2 rows", "4 rows", "8 rows"], True)


async def test_requests_the_backlog_would_make_late_are_refused_at_once() -> None:
    cycle = lifecycle(EchoModel(run_s=0.03), max_batch_size=4, inline_max_ms=0)
    backlog = [submit(cycle, [float(i)] * 4, timeout_s=5.0) for i in range(8)]
    await asyncio.gather(*backlog[:3])  # the pace of backlogged batches is measured
    with pytest.raises(QueueFull) as late:
        submit(cycle, [1.0], timeout_s=0.05)  # 5 batches of ~30 ms ahead
    patient = submit(cycle, [1.0], timeout_s=5.0)
    assert (await patient).outputs == {"y": [2.0]}
    await asyncio.gather(*backlog)
    assert "rows ahead would take about" in late.value.message
    assert (late.value.retry_after_s or 0) >= 1
    alone = submit(cycle, [1.0], timeout_s=0.01)  # nothing ahead: admitted, whatever the pace
    with pytest.raises(DeadlineExceeded):  # (and answered 504 at its deadline, not 429)
        await alone
    await cycle.scheduler.stop()


async def test_a_request_larger_than_a_batch_is_split_and_answered_whole_on_one_version() -> None:
    first, second = EchoModel(1, factor=2.0), EchoModel(2, factor=3.0)
    cycle = lifecycle(first, second, max_batch_size=4)
    cycle.scheduler.hold()
    whole = submit(cycle, [float(i) for i in range(10)])
    cycle.activate(2)  # after admission: the request stays on version 1
    cycle.scheduler.resume()
    answer = await whole
    await cycle.scheduler.stop()
    assert answer.version == 1
    assert np.asarray(answer.outputs["y"]).tolist() == [2.0 * i for i in range(10)]
    assert first.batches == [4, 4, 2]
    assert second.batches == []


async def test_a_request_larger_than_the_queue_is_refused_with_the_limit() -> None:
    cycle = lifecycle(EchoModel(), max_batch_size=4, max_queue_rows=8)
    with pytest.raises(InvalidInput, match="max_queue_rows"):
        submit(cycle, [1.0] * 9)
    await cycle.scheduler.stop()


async def test_a_failing_part_fails_the_whole_request_and_drops_the_queued_parts() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=2)
    with pytest.raises(RLServeError, match="cannot take -1"):
        await submit(cycle, [-1.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    await asyncio.sleep(0.01)
    await cycle.scheduler.stop()
    assert sum(model.batches) < 6  # the parts after the failure did not all run


async def test_under_a_backlog_cheap_batches_run_back_to_back_in_one_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A chain long enough that a busy machine's pause between two batches cannot end it,
    # and an inline threshold that a slow run on a busy machine cannot cross either.
    monkeypatch.setattr(dynamic_batcher, "CHAIN_S", 10.0)
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=2, inline_max_ms=10_000)
    answers = [submit(cycle, [float(i), float(i)]) for i in range(5)]
    batches_in_first_turn: list[int] = []
    asyncio.get_running_loop().call_soon(lambda: batches_in_first_turn.append(len(model.batches)))
    await asyncio.gather(*answers)
    await cycle.scheduler.stop()
    assert batches_in_first_turn == [5]  # no turn of the loop between them
    assert model.batches == [2, 2, 2, 2, 2]


async def test_stopping_does_not_wait_out_max_wait_for_rows_already_waiting() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=8, max_wait_ms=10_000)
    waiting = submit(cycle, [1.0], timeout_s=30.0)
    await asyncio.sleep(0.01)  # planned: waiting for company
    assert model.batches == []
    await asyncio.wait_for(cycle.scheduler.stop(), 1)
    assert waiting.result().outputs == {"y": [2.0]}
    assert not cycle.scheduler.alive


async def turns_until(condition: Any, limit: int = 10) -> int:
    """How many turns of the event loop pass before ``condition()`` holds."""
    for turn in range(limit):
        if condition():
            return turn
        await asyncio.sleep(0)
    raise AssertionError(f"not within {limit} turns")


async def test_callers_answered_together_are_gathered_again_into_one_batch() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=8)
    scheduler = rows_scheduler(cycle)
    await asyncio.gather(*(submit(cycle, [float(i)]) for i in range(4)))
    assert model.batches == [4]
    # The four callers send again, but one turn of the event loop apart each: without
    # gathering the first would run alone.
    again = [submit(cycle, [1.0])]
    assert scheduler.phase is Phase.GATHERING
    for i in range(3):
        await asyncio.sleep(0)
        again.append(submit(cycle, [float(i)]))
    await asyncio.gather(*again)
    await scheduler.stop()
    assert model.batches == [4, 3, 1]  # only the last came after the gathering's turns


async def test_a_lone_caller_is_not_kept_waiting_for_company() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=8)
    scheduler = rows_scheduler(cycle)
    await submit(cycle, [1.0])
    nxt = submit(cycle, [2.0])
    assert scheduler.phase is Phase.PLANNING  # batches of one row: no gathering
    assert await turns_until(nxt.done) <= 2
    await scheduler.stop()


async def test_a_full_batch_ends_the_gathering_and_a_hold_or_stop_interrupts_it() -> None:
    model = EchoModel()
    cycle = lifecycle(model, max_batch_size=2)
    scheduler = rows_scheduler(cycle)
    await asyncio.gather(submit(cycle, [1.0]), submit(cycle, [2.0]))
    first = submit(cycle, [3.0])
    assert scheduler.phase is Phase.GATHERING
    second = submit(cycle, [4.0])
    assert scheduler.phase is Phase.PLANNING  # full: planned in the next turn
    await asyncio.gather(first, second)
    assert model.batches == [2, 2]
    held = submit(cycle, [5.0])
    assert scheduler.phase is Phase.GATHERING
    scheduler.hold()
    assert scheduler.phase is Phase.HELD
    await asyncio.sleep(0.01)
    assert not held.done()
    await asyncio.wait_for(scheduler.stop(), 1)
    assert held.result().outputs == {"y": [10.0]}


async def test_the_phase_says_what_the_scheduler_does_with_its_queue() -> None:
    cycle = lifecycle(EchoModel(run_s=0.2), max_wait_ms=20, inline_max_ms=0)
    scheduler = cycle.scheduler
    assert isinstance(scheduler, DynamicBatchScheduler)
    assert (scheduler.life, scheduler.phase) == (Life.SERVING, Phase.IDLE)
    first = submit(cycle, [1.0])
    assert scheduler.phase is Phase.PLANNING  # in this turn of the loop
    await asyncio.sleep(0)
    assert scheduler.phase is Phase.WAITING  # for company, up to max_wait_ms
    scheduler.hold()
    assert scheduler.phase is Phase.HELD
    scheduler.resume()
    await asyncio.sleep(0.03)
    assert scheduler.phase is Phase.RUNNING  # on the thread, for 200 ms
    scheduler.hold()  # the running batch finishes; then nothing runs
    second = submit(cycle, [2.0])
    await first
    await asyncio.sleep(0.01)
    assert (scheduler.phase, second.done()) == (Phase.HELD, False)
    await scheduler.stop()  # runs what the hold kept
    assert (scheduler.life, scheduler.phase) == (Life.STOPPED, Phase.IDLE)
    assert second.result().outputs == {"y": [4.0]}
