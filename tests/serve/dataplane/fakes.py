"""A duck-typed model and recorders for the scheduler's tests: no contract, no onnxruntime."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar, cast

import numpy as np

from serve.batching.dynamic_batcher import DynamicBatchScheduler
from serve.batching.record import BatchRecord
from serve.config import ModelSettings
from serve.control.lifecycle import ModelLifeCycle
from serve.dataplane.kinds import ModelKind
from serve.dataplane.messages import InferenceRequest, Prepared
from serve.dataplane.model import ServedModel
from serve.dataplane.scheduler import Scheduler
from serve.execution.runtime import ProviderReport
from serve.policy.validation import DEFAULT_OPTIONS
from serve.types import Answer, Outputs


class EchoModel:
    model_kind: ClassVar[ModelKind] = ModelKind.ROWS
    """Answers each request with its own rows times ``factor``; a row equal to -1 breaks the
    model; every batch takes ``run_s`` and is remembered with the thread that ran it."""

    name, sha256, provider = "echo", "0" * 64, "CPUExecutionProvider"
    features = None  # no features view of its own
    provider_report = ProviderReport(("CPUExecutionProvider",), ("CPUExecutionProvider",), ())

    def __init__(self, version: int = 1, factor: float = 2.0, run_s: float = 0.0) -> None:
        self.version, self.factor, self.run_s = version, factor, run_s
        self.batches: list[int] = []  # rows per executed batch
        self.threads: list[int] = []  # the thread that ran each batch

    def prepare(self, request: InferenceRequest) -> Prepared:
        rows = np.asarray(request.inputs["observations"], dtype=np.float32).reshape(-1, 1)
        return Prepared(
            {"x": rows}, len(rows), False, DEFAULT_OPTIONS, None,
            request.request_id, request.received_at, request.deadline,
        )  # fmt: skip

    def execute(self, inputs: dict[str, np.ndarray], requests: Sequence[Prepared]) -> Outputs:
        x = inputs["x"]
        if (x == -1).any():
            raise ValueError("the model cannot take -1")
        if self.run_s:
            time.sleep(self.run_s)
        self.batches.append(len(x))
        self.threads.append(threading.get_ident())
        return {"y": x * self.factor}

    def respond(self, request: Prepared, outputs: Outputs, start: int) -> Answer:
        return {"y": outputs["y"][start : start + request.rows, 0].tolist()}

    def warm_up(self, sizes: Sequence[int]) -> dict[int, float]:
        return {}

    def describe(self) -> dict[str, Any]:
        return {}


class Records:
    """A record sink that keeps what it is given."""

    def __init__(self) -> None:
        self.records: list[BatchRecord] = []

    def accept(self, record: BatchRecord) -> None:
        self.records.append(record)


def lifecycle(*models: EchoModel, sinks: Sequence[Any] = (), **settings: Any) -> ModelLifeCycle:
    """A model's lifecycle with these versions loaded (the first active) and a started
    dynamic batch scheduler."""
    config = ModelSettings(**settings)

    def scheduler(versions: ModelLifeCycle) -> Scheduler:
        return DynamicBatchScheduler("echo", versions, config, sinks)

    wanted = [m.version for m in models]
    cycle = ModelLifeCycle("echo", config, wanted, scheduler, kind=ModelKind.ROWS)
    for model in models:
        cycle.loaded(model_as_served(model))
    cycle.activate(models[0].version)
    cycle.scheduler.start()
    return cycle


def model_as_served(model: EchoModel) -> ServedModel:
    return cast(ServedModel, model)  # duck-typed: a scheduler never reads the contract


def request(rows: Any, timeout_s: float = 1.0, request_id: str = "r") -> InferenceRequest:
    now = time.monotonic()
    return InferenceRequest({"observations": rows}, {}, request_id, now, now + timeout_s)
