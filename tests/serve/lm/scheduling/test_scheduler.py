"""The continuous-batching scheduler with a fake decoder (no onnxruntime): sequences
joining a running batch, leaving when done, deadlines, back-pressure, scoring on the same
thread, versions swapped while sequences run, hold, cancel and stop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, cast

import pytest

from kernel.errors import (
    DeadlineExceeded,
    InvalidInput,
    QueueFull,
    RLServeError,
    ServiceUnavailable,
)
from serve.config import ModelSettings
from serve.control.lifecycle import ModelLifeCycle
from serve.dataplane.kinds import ModelKind
from serve.dataplane.model import ServedModel
from serve.dataplane.routing import Route
from serve.dataplane.scheduler import Scheduler
from serve.lm.messages import FinishReason, GenerationSpec, ScoreSpec
from serve.lm.model import LanguageModel
from serve.lm.scheduling.generation_record import StepRecord
from serve.lm.scheduling.generation_stream import GenerationStream
from serve.lm.scheduling.scheduler import ContinuousBatchScheduler
from tests.serve.lm import fakes

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Steps:
    """A generation sink that keeps every step record."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def accept_step(self, record: StepRecord) -> None:
        self.records.append(record)


def lifecycle(*models: LanguageModel, sink: Steps | None = None, **settings: Any) -> ModelLifeCycle:
    config = ModelSettings(**settings)

    def scheduler(versions: ModelLifeCycle) -> Scheduler:
        return ContinuousBatchScheduler("fake", versions, config, sink)

    wanted = [m.version for m in models]
    cycle = ModelLifeCycle("fake", config, wanted, scheduler, kind=ModelKind.GENERATIONS)
    for model in models:
        cycle.loaded(cast(ServedModel, model))
    cycle.activate(models[0].version)
    cycle.scheduler.start()
    return cycle


def scheduler_of(cycle: ModelLifeCycle) -> ContinuousBatchScheduler:
    assert isinstance(cycle.scheduler, ContinuousBatchScheduler)
    return cycle.scheduler


def model_of(cycle: ModelLifeCycle, version: int | None = None) -> LanguageModel:
    model = cycle.active_model if version is None else cycle.get(version)
    assert isinstance(model, LanguageModel)
    return model


def generate(
    cycle: ModelLifeCycle,
    prompt: str,
    max_new_tokens: int,
    *,
    timeout_s: float = 5.0,
    version: int | None = None,
    tokens: bool = False,
    **sampling: Any,
) -> GenerationStream:
    now = time.monotonic()
    spec = GenerationSpec(
        prompt, None, max_new_tokens, sampling.get("temperature"), None, None,
        sampling.get("seed"), (), "id", now, now + timeout_s,
    )  # fmt: skip
    generation = model_of(cycle, version).prepare_generation(spec)
    return scheduler_of(cycle).submit_generation(generation, version, tokens=tokens)


def ids(text: str) -> list[int]:
    return [fakes.BOS, *(fakes.word(w) for w in text.split())]


PROMPTS = ["w1", "w2 w3 w4 w5 w6 w7 w8 w9", "w10 w11 w12", "w13 w14 w15 w16 w17 w18 w19 w20 w21"]


async def test_requests_of_uneven_lengths_decode_together_and_exactly():
    decoder = fakes.FakeDecoder()
    steps = Steps()
    cycle = lifecycle(fakes.language_model(decoder=decoder), sink=steps)
    budgets = [30, 5, 17, 40]
    cycle.hold()  # all four queued before the decoding thread takes any: they join together
    streams = [generate(cycle, p, n) for p, n in zip(PROMPTS, budgets, strict=True)]
    cycle.resume()
    results = await asyncio.gather(*(s.result() for s in streams))
    await cycle.scheduler.stop()
    for prompt, budget, result in zip(PROMPTS, budgets, results, strict=True):
        assert list(result.token_ids) == fakes.reference(ids(prompt), budget)
        assert result.version == 1
        assert result.prompt_tokens == len(ids(prompt))
    assert max(rows for kind, rows in decoder.calls if kind == "step") == 4  # shared steps
    assert len(decoder.threads) == 1
    assert threading.get_ident() not in decoder.threads
    assert sum(r.new_tokens for r in steps.records) == sum(len(r.token_ids) for r in results)
    assert max(n for r in steps.records for n in r.step_sequences) == 4
    assert len([s for r in steps.records for s in r.first_token_s]) == 4


async def test_a_late_request_joins_the_running_batch_and_finishes_first():
    decoder = fakes.FakeDecoder(step_s=0.002)
    cycle = lifecycle(fakes.language_model(decoder=decoder, context_length=400))
    long = [
        generate(cycle, p, 300, tokens=True, temperature=5.0, seed=i)
        for i, p in enumerate(PROMPTS[:3])
    ]
    for stream in long:
        await anext(stream)  # each is decoding
    late = generate(cycle, "w30 w31", 3)
    result = await late.result()
    assert [s.done for s in long] == [False, False, False]  # the late one did not wait for them
    assert len(result.token_ids) == 3
    assert ("step", 4) in decoder.calls  # it decoded beside them
    for stream in long:
        stream.cancel()
    await cycle.scheduler.stop()


async def test_a_sequence_that_finishes_leaves_the_batch_at_once():
    decoder = fakes.FakeDecoder()
    cycle = lifecycle(fakes.language_model(decoder=decoder))
    short, long = generate(cycle, "w1 w2", 2), generate(cycle, "w3", 20)
    await asyncio.gather(short.result(), long.result())
    await cycle.scheduler.stop()
    step_rows = [rows for kind, rows in decoder.calls if kind == "step"]
    assert step_rows[0] == 2
    assert set(step_rows[1:]) == {1}
    assert len(step_rows) == 19  # prefill gave the first of 20 tokens


async def test_seeded_sampling_gives_the_same_tokens_whatever_shares_the_batch():
    cycle = lifecycle(fakes.language_model())
    alone = await generate(cycle, "w5 w6", 25, temperature=1.0, seed=11).result()
    crowd = [generate(cycle, p, 25, temperature=1.0, seed=i) for i, p in enumerate(PROMPTS)]
    again = generate(cycle, "w5 w6", 25, temperature=1.0, seed=11)
    other = generate(cycle, "w5 w6", 25, temperature=1.0, seed=12)
    results = await asyncio.gather(again.result(), other.result(), *(s.result() for s in crowd))
    await cycle.scheduler.stop()
    assert results[0].token_ids == alone.token_ids
    assert results[1].token_ids != alone.token_ids


async def test_tokens_stream_in_order_and_add_up_to_the_result():
    cycle = lifecycle(fakes.language_model())
    stream = generate(cycle, "w1 w2 w3", 12, tokens=True)
    events = [event async for event in stream]
    result = await stream.result()
    await cycle.scheduler.stop()
    assert [e.index for e in events] == list(range(len(result.token_ids)))
    assert tuple(e.token_id for e in events) == result.token_ids
    assert "".join(e.text for e in events) == result.text
    assert stream.model_version == 1
    assert stream.model_sha256 == result.sha256


async def test_scoring_runs_on_the_decoding_thread_beside_generations():
    decoder = fakes.FakeDecoder()
    cycle = lifecycle(fakes.language_model(decoder=decoder))
    running = generate(cycle, "w1", 30)
    now = time.monotonic()
    spec = ScoreSpec("w1 w2", None, ("w3 w4", "w5"), "id", now, now + 5)
    scoring = model_of(cycle).prepare_scoring(spec)
    result = await scheduler_of(cycle).submit_scoring(scoring, None)
    await running.result()
    await cycle.scheduler.stop()
    assert [s.token_ids for s in result.scores] == [
        (fakes.word("w3"), fakes.word("w4")),
        (fakes.word("w5"),),
    ]
    assert ("forward", 2) in decoder.calls
    assert len(decoder.threads) == 1
    for completion in result.scores:
        assert completion.total == pytest.approx(sum(completion.log_probs))
        assert all(lp < 0 for lp in completion.log_probs)


async def test_a_request_past_its_deadline_is_answered_504_and_leaves():
    decoder = fakes.FakeDecoder(step_s=0.002)
    cycle = lifecycle(fakes.language_model(decoder=decoder, context_length=400))
    slow = generate(cycle, "w1", 300, timeout_s=0.05, temperature=5.0, seed=1)
    with pytest.raises(DeadlineExceeded, match="deadline of 50 ms"):
        await slow.result()
    calls = len(decoder.calls)
    await asyncio.sleep(0.03)
    assert len(decoder.calls) <= calls + 1  # it left the batch: nothing decodes any more
    await cycle.scheduler.stop()


async def test_a_request_queued_past_its_deadline_never_runs():
    decoder = fakes.FakeDecoder(step_s=0.003)
    cycle = lifecycle(fakes.language_model(decoder=decoder, context_length=400), max_sequences=1)
    running = generate(cycle, "w1", 300, temperature=5.0, seed=3)
    waiting = generate(cycle, "w2", 5, timeout_s=0.03)
    with pytest.raises(DeadlineExceeded, match="not run"):
        await waiting.result()
    assert decoder.calls.count(("prefill", 1)) == 1
    running.cancel()
    await cycle.scheduler.stop()


async def test_a_full_queue_refuses_at_once_with_429():
    cycle = lifecycle(fakes.language_model(decoder=fakes.FakeDecoder(0.01)), max_queue_rows=2)
    cycle.hold()
    streams = [generate(cycle, "w1", 3), generate(cycle, "w2", 3)]
    with pytest.raises(QueueFull, match="queue full") as refused:
        generate(cycle, "w3", 3)
    assert refused.value.retry_after_s is not None
    assert refused.value.retry_after_s >= 1
    assert not scheduler_of(cycle).would_admit(1, time.monotonic() + 1)
    cycle.resume()
    await asyncio.gather(*(s.result() for s in streams))
    await cycle.scheduler.stop()


async def test_hold_runs_nothing_until_resume():
    decoder = fakes.FakeDecoder()
    cycle = lifecycle(fakes.language_model(decoder=decoder))
    cycle.hold()
    stream = generate(cycle, "w1", 4)
    await asyncio.sleep(0.05)
    assert decoder.calls == []
    assert not stream.done
    cycle.resume()
    assert len((await stream.result()).token_ids) == 4
    await cycle.scheduler.stop()


async def test_a_swap_lets_running_sequences_finish_on_their_version():
    old, new = fakes.FakeDecoder(step_s=0.001), fakes.FakeDecoder()
    v1 = fakes.language_model(1, decoder=old, context_length=400)
    v2 = fakes.language_model(2, decoder=new, context_length=400)
    cycle = lifecycle(v1, v2)
    running = generate(cycle, "w1", 120, tokens=True, temperature=5.0, seed=2)
    await anext(running)
    prepared_by_v1 = generate(cycle, "w9", 5)  # not pinned: moves to whatever is active
    cycle.activate(2)
    after = generate(cycle, "w2", 5)
    pinned = generate(cycle, "w3", 5, version=1)
    results = await asyncio.gather(
        running.result(), prepared_by_v1.result(), after.result(), pinned.result()
    )
    await cycle.scheduler.stop()
    assert [r.version for r in results] == [1, 2, 2, 1]
    assert len(results[0].token_ids) == 120
    assert scheduler_of(cycle).pinned_versions() == set()


async def test_running_versions_stay_pinned_while_they_decode():
    v1 = fakes.language_model(1, decoder=fakes.FakeDecoder(0.002), context_length=400)
    cycle = lifecycle(v1, fakes.language_model(2))
    running = generate(cycle, "w1", 200, tokens=True, temperature=5.0, seed=4)
    await anext(running)
    await asyncio.sleep(0.01)
    cycle.activate(2)
    assert 1 in scheduler_of(cycle).pinned_versions()
    running.cancel()
    await cycle.scheduler.stop()


async def test_a_cancelled_generation_leaves_the_batch():
    decoder = fakes.FakeDecoder(step_s=0.002)
    cycle = lifecycle(fakes.language_model(decoder=decoder, context_length=400))
    stream = generate(cycle, "w1", 300, tokens=True, temperature=5.0, seed=5)
    await anext(stream)
    stream.cancel()
    with pytest.raises(ServiceUnavailable, match="went away"):
        await stream.result()
    await asyncio.sleep(0.02)
    calls = len(decoder.calls)
    await asyncio.sleep(0.02)
    assert len(decoder.calls) == calls
    await cycle.scheduler.stop()


async def test_the_cache_bytes_fall_to_zero_when_a_held_sequence_is_cancelled():
    # Resumed, the step only drops the cancelled sequence: nothing decoded, no token, but
    # the cache it held is gone, and the last record must say so (the gauge kept it).
    steps = Steps()
    decoder = fakes.FakeDecoder(step_s=0.002)
    cycle = lifecycle(fakes.language_model(decoder=decoder, context_length=400), sink=steps)
    stream = generate(cycle, "w1 w2 w3", 300, tokens=True, temperature=5.0, seed=6)
    await anext(stream)
    cycle.hold()
    await asyncio.sleep(0.05)  # the thread idles, held: its record has the cache held
    held = steps.records[-1].cache_bytes
    stream.cancel()  # the client leaves while held
    cycle.resume()
    await asyncio.sleep(0.05)
    await cycle.scheduler.stop()
    assert held > 0
    assert steps.records[-1].cache_bytes == 0


async def test_a_failing_step_fails_its_batch_and_the_scheduler_goes_on():
    decoder = fakes.FakeDecoder()
    decoder.fail_on = fakes.reference(ids("w1"), 1)[0]  # the first step feeds it: it fails
    cycle = lifecycle(fakes.language_model(decoder=decoder))
    broken = generate(cycle, "w1", 5)
    with pytest.raises(RLServeError, match="model 'fake' failed on this input: the fake cannot"):
        await broken.result()
    decoder.fail_on = None
    assert len((await generate(cycle, "w1", 3).result()).token_ids) == 3
    await cycle.scheduler.stop()


async def test_stop_decodes_everything_admitted_then_refuses():
    decoder = fakes.FakeDecoder(step_s=0.001)
    cycle = lifecycle(fakes.language_model(decoder=decoder))
    cycle.hold()
    streams = [generate(cycle, p, 10) for p in PROMPTS]
    stopping = asyncio.ensure_future(cycle.scheduler.stop())
    await asyncio.sleep(0)
    with pytest.raises(ServiceUnavailable, match="not running"):
        generate(cycle, "w1", 3)
    results = await asyncio.gather(*(s.result() for s in streams))
    await stopping
    assert [list(r.token_ids) for r in results] == [fakes.reference(ids(p), 10) for p in PROMPTS]
    assert not cycle.scheduler.alive


async def test_the_predict_path_is_told_to_generate():
    # The scheduler takes no rows (it has no submit), and the version has no row methods:
    # a route of rows to a language model is refused by the route's kind.
    cycle = lifecycle(fakes.language_model())
    route = Route("fake", cycle.kind, cycle.scheduler, model_of(cycle), None, 1000.0)
    with pytest.raises(InvalidInput, match="/v1/models/fake/generate"):
        route.row_scheduler()
    with pytest.raises(InvalidInput, match="/v1/models/fake/generate"):
        route.row_model()
    await cycle.scheduler.stop()


async def test_finish_reasons():
    cycle = lifecycle(fakes.language_model())
    result = await generate(cycle, "w1", 3).result()
    assert result.finish_reason is FinishReason.LENGTH
    await cycle.scheduler.stop()


async def test_a_draining_swap_keeps_queued_requests_on_the_old_version():
    cycle = lifecycle(fakes.language_model(1), fakes.language_model(2))
    cycle.hold()
    queued = generate(cycle, "w1", 3)
    cycle.scheduler.pin_queued(1)
    assert cycle.scheduler.pinned_versions() == {1}
    cycle.activate(2)
    later = generate(cycle, "w1", 3)
    cycle.resume()
    first, second = await asyncio.gather(queued.result(), later.result())
    await cycle.scheduler.stop()
    assert (first.version, second.version) == (1, 2)


async def test_steps_that_end_while_the_loop_is_busy_reach_the_stream_together():
    decoder = fakes.FakeDecoder(step_s=0.001)
    steps = Steps()
    cycle = lifecycle(fakes.language_model(decoder=decoder, context_length=400), sink=steps)
    stream = generate(cycle, "w1 w2 w3", 200, tokens=True)
    first = await anext(stream)
    time.sleep(0.05)  # the event loop is busy: about 50 steps end meanwhile
    behind = stream.drain()
    await asyncio.sleep(0)  # the hand-over of those steps runs
    together = stream.drain()
    rest = [event async for event in stream]
    result = await stream.result()
    await cycle.scheduler.stop()
    events = [first, *behind, *together, *rest]
    assert len(together) > 10  # many steps' tokens, handed over at once
    assert [e.index for e in events] == list(range(200))
    assert tuple(e.token_id for e in events) == result.token_ids
    assert sum(r.new_tokens for r in steps.records) == 200  # the metrics miss none of them
