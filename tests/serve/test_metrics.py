"""Metrics updated per batch count what one-by-one updates would have counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

from serve import config
from serve.batching.record import BatchRecord
from serve.control import repository
from serve.dataplane.messages import Prepared
from serve.dataplane.model import ServedModel
from serve.dataplane.scheduler import Load
from serve.metrics import LATENCY_BUCKETS, Metrics, Tally
from serve.policy.validation import DEFAULT_OPTIONS


def test_tallied_observations_once_flushed_equal_observing_them_one_by_one() -> None:
    values = [0.0, 0.0004, 0.0005, 0.0031, 0.2, 7.5, 0.0005, 1e-9]
    one, many = CollectorRegistry(), CollectorRegistry()
    single = Histogram("latency", "h", buckets=LATENCY_BUCKETS, registry=one)
    tally = Tally.of(Histogram("latency", "h", buckets=LATENCY_BUCKETS, registry=many))
    for value in values:
        single.observe(value)
        tally.add(value)
    assert samples(many) != samples(one)  # nothing reached the histogram yet
    tally.flush()
    assert samples(one) == samples(many)


def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    ]


def record(
    rows: list[int], model: str = "m", version: int = 3, out_of_bounds: list[int] | None = None
) -> BatchRecord:
    outside = out_of_bounds or [0] * len(rows)
    requests = tuple(
        Prepared({}, n, False, DEFAULT_OPTIONS, None, f"r{i}", 1.0, 9.0, outside[i])
        for i, n in enumerate(rows)
    )
    offsets = tuple(int(x) for x in np.cumsum([0, *rows]))
    return BatchRecord(
        model=model,
        version=version,
        sha256="0" * 64,
        request_ids=tuple(r.request_id for r in requests),
        requests=requests,
        offsets=offsets,
        inputs={},
        outputs={},
        received_at=(1.0,) * len(rows),
        enqueued_at=(1.5,) * len(rows),
        started_at=2.0,
        finished_at=2.25,
        max_rows=8,
    )


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


def test_a_batch_record_counts_its_requests_rows_and_times() -> None:
    metrics = Metrics()
    metrics.sink.accept(record([2, 1, 1]))
    labels = {"model": "m", "version": "3"}
    assert sample(metrics, "rlserve_requests_total", status="200", **labels) == 0
    metrics.sink.flush()  # the batch's tallies reach the metrics
    assert sample(metrics, "rlserve_requests_total", status="200", **labels) == 3
    assert sample(metrics, "rlserve_batch_rows_sum", **labels) == 4
    assert sample(metrics, "rlserve_batch_fill_ratio_sum", **labels) == 0.5
    assert sample(metrics, "rl_inference_latency_seconds_sum", **labels) == 0.25
    assert sample(metrics, "rlserve_queue_wait_seconds_sum", **labels) == 1.5
    assert sample(metrics, "rlserve_request_latency_seconds_count", model="m") == 3
    assert sample(metrics, "rlserve_request_latency_seconds_sum", model="m") == 3 * 1.25
    metrics.sink.flush()  # nothing new: nothing changes
    assert sample(metrics, "rlserve_requests_total", status="200", **labels) == 3


def test_a_scrape_and_a_load_sample_flush_the_tallies() -> None:
    metrics = Metrics()
    metrics.sink.accept(record([1]))
    metrics.sink.flush()  # what a scrape does first
    text = metrics.exposition()[0]
    assert b'rlserve_requests_total{model="m",status="200",version="3"} 1.0' in text
    metrics.sink.accept(record([1]))
    metrics.sample_load({})
    assert sample(metrics, "rlserve_requests_total", model="m", version="3", status="200") == 2


def test_load_gauges_sum_the_models() -> None:
    metrics = Metrics()
    metrics.sample_load({"a": Load(3, 5, 2), "b": Load(1, 1, 1)})
    assert sample(metrics, "rlserve_queue_rows", model="a") == 3
    assert sample(metrics, "rlserve_pending_rows") == 6
    assert sample(metrics, "rlserve_inflight_requests") == 3
    metrics.sample_load({"a": Load(0, 0, 0), "b": Load(1, 1, 1)})
    assert sample(metrics, "rlserve_queue_rows", model="a") == 0
    assert sample(metrics, "rlserve_pending_rows") == 1


DEMO = Path(__file__).resolve().parents[2] / "examples/model_repository/cartpole/1/model.onnx"


def demo_version(version: int) -> ServedModel:
    """The bundled demo policy, loaded as version ``version`` of model m."""
    settings = config.load(providers=["CPUExecutionProvider"])
    return repository.load_file("m", version, DEMO, settings, settings.for_model({}))


def test_an_unloaded_versions_series_are_retired_but_its_answers_are_kept() -> None:
    metrics = Metrics()
    loaded = demo_version(3)
    metrics.version_loaded("m", loaded)
    metrics.sink.accept(record([2]))
    metrics.version_unloaded("m", 3, loaded.provider, loaded.sha256)
    text = metrics.exposition()[0].decode()
    assert 'rlserve_requests_total{model="m",status="200",version="3"} 1.0' in text
    assert 'rlserve_batch_rows_count{model="m",version="3"}' not in text
    assert 'rlserve_model_info{model="m"' not in text
    metrics.version_loaded("m", loaded)  # loaded again: fine
    metrics.sink.accept(record([1]))
    metrics.sink.flush()
    assert sample(metrics, "rlserve_batch_rows_count", model="m", version="3") == 1


def test_rows_outside_the_bounds_are_counted_per_model_from_batches_and_refusals() -> None:
    metrics = Metrics()
    metrics.sink.accept(record([1, 4, 2], out_of_bounds=[1, 3, 0]))
    metrics.sink.accept(record([2], version=4, out_of_bounds=[2]))  # the same model
    metrics.sink.accept(record([1], model="n"))  # in bounds: the series exists, at 0
    assert sample(metrics, "rlserve_observations_out_of_bounds_total", model="m") == 0
    metrics.sink.flush()
    assert sample(metrics, "rlserve_observations_out_of_bounds_total", model="m") == 6
    assert sample(metrics, "rlserve_observations_out_of_bounds_total", model="n") == 0
    metrics.refused_out_of_bounds("m", 5)  # observation_bounds: reject
    assert sample(metrics, "rlserve_observations_out_of_bounds_total", model="m") == 11
    metrics.sink.accept(record([1], out_of_bounds=[1]))
    metrics.version_unloaded("m", 3, "CPUExecutionProvider", "0" * 64)  # flushed, and kept
    text = metrics.exposition()[0].decode()
    assert 'rlserve_observations_out_of_bounds_total{model="m"} 12.0' in text
