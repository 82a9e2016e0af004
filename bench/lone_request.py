"""What a lone request costs in the dynamic batch scheduler: microseconds per request at batch 1.

Requests are submitted one at a time to an idle scheduler, each awaited before the next,
so every one finds the model idle and runs alone: the scheduler's work per request
(admission, queue, plan, run, record, metrics sink, answer, deadline timer) is paid in full
by one row, never shared by a batch. Two models: ``null`` answers without computing
(the scheduler's own cost) and ``cartpole`` is the bundled policy as the server loads it
(its run is measured alone too, so the difference is what the scheduler adds).

    .venv/bin/python -m bench.lone_request [--requests 10000] [--repeats 5]

Times are the process's CPU time (``time.process_time``), which other processes sharing the
cores disturb less than wall time; a request is answered on one thread, and onnxruntime
runs cartpole with one intra-op thread. Prints the best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np

from serve import config
from serve.batching.dynamic_batcher import DynamicBatchScheduler
from serve.control import repository
from serve.control.lifecycle import ModelLifeCycle
from serve.dataplane.kinds import ModelKind
from serve.dataplane.messages import InferenceRequest, Prepared
from serve.dataplane.model import RowModel, ServedModel, as_rows
from serve.dataplane.scheduler import Scheduler
from serve.metrics import Metrics
from serve.policy.validation import DEFAULT_OPTIONS
from serve.types import Answer, Outputs

REPOSITORY = Path(__file__).resolve().parents[1] / "examples" / "model_repository"


class NullModel:
    """Answers every row with its input: a model that costs nothing to run."""

    name, version, sha256, provider = "null", 1, "0" * 64, "CPUExecutionProvider"
    model_kind: ClassVar[ModelKind] = ModelKind.ROWS

    def execute(self, inputs: dict[str, np.ndarray], requests: Sequence[Prepared]) -> Outputs:
        return {"y": inputs["x"]}

    def respond(self, request: Prepared, outputs: Outputs, start: int) -> Answer:
        return {"y": outputs["y"][start : start + request.rows]}


@dataclass(frozen=True)
class Timing:
    model: str
    us_per_request: float  # CPU time from submit to answer, through the scheduler
    us_per_run: float  # CPU time of the model's execute alone, on the same rows


def _lifecycle(model: ServedModel, name: str) -> ModelLifeCycle:
    settings = config.load(model_repository=REPOSITORY).for_model({})  # the defaults
    metrics = Metrics()
    sinks = (metrics.sink,)

    def scheduler(versions: ModelLifeCycle) -> Scheduler:
        return DynamicBatchScheduler(name, versions, settings, sinks)

    cycle = ModelLifeCycle(name, settings, [model.version], scheduler, kind=ModelKind.ROWS)
    cycle.loaded(model)
    cycle.activate(model.version)
    return cycle


def _null_requests(count: int) -> list[Prepared]:
    now = time.monotonic()
    row = np.zeros((1, 4), dtype=np.float32)
    return [
        Prepared({"x": row}, 1, False, DEFAULT_OPTIONS, None, f"r{i}", now, now + 600.0)
        for i in range(count)
    ]


def _cartpole_requests(model: RowModel, count: int) -> list[Prepared]:
    now = time.monotonic()
    observation = [0.01, -0.02, 0.03, 0.04]
    return [
        model.prepare(InferenceRequest({"observations": observation}, {}, f"r{i}", now, now + 600))
        for i in range(count)
    ]


async def _through_scheduler(cycle: ModelLifeCycle, requests: list[Prepared]) -> float:
    scheduler = cycle.scheduler
    assert isinstance(scheduler, DynamicBatchScheduler)
    scheduler.start()
    for prepared in requests[:100]:  # warm: run times measured, caches filled
        await scheduler.submit(prepared, None)
    started = time.process_time()
    for prepared in requests:
        await scheduler.submit(prepared, None)
    elapsed = time.process_time() - started
    await scheduler.stop()
    return elapsed / len(requests) * 1e6


def _run_alone(model: RowModel, requests: list[Prepared]) -> float:
    started = time.process_time()
    for prepared in requests:
        model.execute(prepared.feeds, [prepared])
    return (time.process_time() - started) / len(requests) * 1e6


def measure(model: RowModel, requests: list[Prepared], repeats: int) -> Timing:
    through = min(
        asyncio.run(_through_scheduler(_lifecycle(model, model.name), requests))
        for _ in range(repeats)
    )
    alone = min(_run_alone(model, requests) for _ in range(repeats))
    return Timing(model.name, through, alone)


def _cartpole() -> RowModel:
    settings = config.load(model_repository=REPOSITORY)
    (where,) = repository.discover(REPOSITORY)["cartpole"]
    return as_rows(repository.load_version(where, settings, settings.for_model({})))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args: Any = parser.parse_args(argv)
    null = cast(RowModel, NullModel())
    cartpole = _cartpole()
    for timing in (
        measure(null, _null_requests(args.requests), args.repeats),
        measure(cartpole, _cartpole_requests(cartpole, args.requests), args.repeats),
    ):
        print(
            f"{timing.model}: {timing.us_per_request:.1f} µs of CPU per request through the "
            f"scheduler, {timing.us_per_run:.1f} µs of it the model's run, "
            f"{timing.us_per_request - timing.us_per_run:.1f} µs the rest"
        )


if __name__ == "__main__":
    main()
