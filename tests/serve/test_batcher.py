"""The dynamic batcher with a fake model: batching, routing, back-pressure, expiry, isolation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pytest

from serve.config import ModelSettings
from serve.control.versions import VersionTable
from serve.dataplane.dynamic_batcher import Batcher
from serve.dataplane.model import ServedModel
from serve.dataplane.runtime import ProviderReport
from serve.errors import DeadlineExceeded, QueueFull, RLServeError
from serve.metrics import Metrics
from serve.types import Answer, Outputs, PredictOptions, Prepared


class EchoModel:
    """Answers each request with its own rows doubled; rows equal to -1 break the model."""

    name, version, sha256, provider = "echo", 1, "0" * 64, "CPUExecutionProvider"
    provider_report = ProviderReport(("CPUExecutionProvider",), ("CPUExecutionProvider",), ())

    def __init__(self) -> None:
        self.batches: list[int] = []  # rows per executed batch

    def prepare(self, payload: Any) -> Prepared:
        rows = np.asarray(payload, dtype=np.float32).reshape(-1, 1)
        return Prepared({"x": rows}, len(rows), False, PredictOptions())

    def execute(self, batch: Sequence[Prepared], padded_rows: int) -> Outputs:
        x = np.concatenate([p.feeds["x"] for p in batch])
        if (x == -1).any():
            raise ValueError("the model cannot take -1")
        self.batches.append(len(x))
        return {"y": x * 2}

    def answer(self, batch: Sequence[Prepared], outputs: Outputs) -> list[Answer | RLServeError]:
        edges = np.cumsum([p.rows for p in batch])[:-1]
        return [{"y": part[:, 0].tolist()} for part in np.split(outputs["y"], edges)]

    def warm_up(self, sizes: Sequence[int]) -> None: ...

    def describe(self) -> dict[str, Any]:
        return {}


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make(model: EchoModel, **settings: Any) -> Batcher:
    versions = VersionTable()
    versions.add(cast(ServedModel, model))  # a duck-typed model: no contract needed here
    versions.activate(model.version)
    return Batcher(model.name, versions, ModelSettings(**settings), Metrics())


def prepare(batcher: Batcher, payload: Any) -> Prepared:
    model = batcher.versions.active_model
    assert model is not None
    return model.prepare(payload)


async def submit(batcher: Batcher, payload: Any, timeout_s: float = 1.0) -> Answer:
    stamped = await batcher.submit(prepare(batcher, payload), time.monotonic() + timeout_s)
    return stamped.answer


async def test_concurrent_requests_share_a_batch_and_get_their_own_rows_back() -> None:
    model = EchoModel()
    batcher = make(model, max_batch_size=16, max_wait_ms=20)
    batcher.start()
    answers = await asyncio.gather(*(submit(batcher, [i, i + 0.5]) for i in range(6)))
    await batcher.stop()
    assert answers == [{"y": [2 * i, 2 * i + 1]} for i in range(6)]
    assert model.batches == [12]


async def test_a_full_queue_refuses_with_a_retry_hint() -> None:
    batcher = make(EchoModel(), max_batch_size=4, max_wait_ms=1000, max_queue_rows=3)
    batcher.submit(prepare(batcher, [1, 2]), time.monotonic() + 1)
    with pytest.raises(QueueFull) as caught:
        batcher.submit(prepare(batcher, [3, 4]), time.monotonic() + 1)
    assert caught.value.headers["Retry-After"].isdigit()


async def test_a_request_whose_deadline_passes_in_the_queue_is_never_run() -> None:
    model = EchoModel()
    batcher = make(model, max_batch_size=8, max_wait_ms=500)
    batcher.start()
    with pytest.raises(DeadlineExceeded, match="not run"):
        await submit(batcher, [1.0], timeout_s=0.02)
    await batcher.stop()
    assert model.batches == []


async def test_a_request_that_breaks_the_model_fails_alone() -> None:
    model = EchoModel()
    batcher = make(model, max_batch_size=8, max_wait_ms=20)
    batcher.start()
    results = await asyncio.gather(
        submit(batcher, [1.0]),
        submit(batcher, [-1.0]),
        submit(batcher, [3.0]),
        return_exceptions=True,
    )
    await batcher.stop()
    assert results[0] == {"y": [2.0]}
    assert isinstance(results[1], RLServeError)
    assert "cannot take -1" in results[1].message
    assert results[2] == {"y": [6.0]}


async def test_stopping_answers_everything_still_queued() -> None:
    batcher = make(EchoModel(), max_batch_size=8, max_wait_ms=10_000)
    batcher.start()
    pending = [asyncio.ensure_future(submit(batcher, [float(i)])) for i in range(3)]
    await asyncio.sleep(0.01)
    await batcher.stop()
    assert [p.result() for p in pending] == [{"y": [0.0]}, {"y": [2.0]}, {"y": [4.0]}]


async def test_expired_and_live_requests_in_one_plan_each_get_their_own_answer() -> None:
    model = EchoModel()
    batcher = make(model, max_batch_size=8, max_wait_ms=50)
    now = time.monotonic()
    expired = batcher.submit(prepare(batcher, [1.0]), now + 0.01)
    live = [batcher.submit(prepare(batcher, [float(i)]), now + 5) for i in (2, 3)]
    await asyncio.sleep(0.02)
    batcher.start()
    answers = [(await f).answer for f in live]
    await batcher.stop()
    with pytest.raises(DeadlineExceeded):
        expired.result()
    assert answers == [{"y": [4.0]}, {"y": [6.0]}]
    assert model.batches == [2]


class OtherEcho(EchoModel):
    version, sha256 = 2, "2" * 64

    def execute(self, batch: Sequence[Prepared], padded_rows: int) -> Outputs:
        return {"y": super().execute(batch, padded_rows)["y"] * 10}


async def test_requests_run_on_the_version_active_when_their_batch_forms() -> None:
    batcher = make(EchoModel(), max_batch_size=8, max_wait_ms=30)
    batcher.versions.add(cast(ServedModel, OtherEcho()))
    batcher.start()
    first = batcher.submit(prepare(batcher, [1.0]), time.monotonic() + 1)
    batcher.versions.activate(2)  # queued before the swap: still runs on version 2
    stamped = await first
    await batcher.stop()
    assert (stamped.version, stamped.answer) == (2, {"y": [20.0]})


async def test_pinned_requests_stay_on_their_version_and_never_share_a_batch() -> None:
    batcher = make(EchoModel(), max_batch_size=8, max_wait_ms=30)
    batcher.versions.add(cast(ServedModel, OtherEcho()))
    batcher.start()
    deadline = time.monotonic() + 1
    old = batcher.submit(prepare(batcher, [1.0]), deadline)
    batcher.pin_queued(1)  # a draining swap: what was queued stays on version 1
    batcher.versions.activate(2)
    new = batcher.submit(prepare(batcher, [1.0]), deadline)
    results = [await old, await new]
    await batcher.stop()
    assert [(r.version, r.answer) for r in results] == [(1, {"y": [2.0]}), (2, {"y": [20.0]})]


async def test_a_held_batcher_runs_nothing_but_still_expires() -> None:
    model = EchoModel()
    batcher = make(model, max_batch_size=8, max_wait_ms=1)
    batcher.start()
    batcher.hold()
    with pytest.raises(DeadlineExceeded):
        await submit(batcher, [1.0], timeout_s=0.05)
    waiting = asyncio.ensure_future(submit(batcher, [2.0]))
    await asyncio.sleep(0.05)
    assert model.batches == []
    batcher.resume()
    assert await waiting == {"y": [4.0]}
    await batcher.stop()
