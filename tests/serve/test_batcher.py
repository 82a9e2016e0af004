"""The dynamic batcher with a fake model: batching, routing, back-pressure, expiry, isolation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pytest

from serve.batcher import Batcher
from serve.config import ModelSettings
from serve.errors import DeadlineExceeded, QueueFull, RLServeError
from serve.metrics import Metrics
from serve.model import ServedModel
from serve.runtime import ProviderReport
from serve.types import Answer, Outputs, PredictOptions, Prepared
from serve.versions import VersionTable


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
