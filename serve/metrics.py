"""Prometheus metrics, correct under several gunicorn workers.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``serve/gunicorn.conf.py`` sets it before any worker
starts), every worker writes its values to files there and ``/metrics`` sums all workers;
gauges say how (``livesum``: the pod's total over live workers). Without it, the metrics
live in this process's registry.

Names: ``rlserve_*`` for the server's own; ``rl_inference_latency_seconds`` is the name
operators already query for model execution time per batch.

The request path touches no metric per request: answered requests are counted from each
executed batch's record (:class:`MetricsSink`, one update per batch and label set), the
load gauges are sampled from the schedulers a few times a second
(:meth:`Metrics.sample_load`), and only refused requests are counted one by one. Label
values are bounded: a model label names a served model (``""`` for requests naming none
that exists), a version label a loaded version.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from serve.dataplane.record import BatchRecord
from serve.dataplane.scheduler import Load
from serve.gpu import gpu_collector

# Seconds, with the resolution that matters for millisecond-scale policies.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0,
)  # fmt: skip
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FILL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
UPDATE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        disable_created_metrics()  # *_created series only double what scrapers store
        self.registry = registry or CollectorRegistry()
        r = self.registry
        mv = ("model", "version")
        self.requests = Counter(
            "rlserve_requests", "Requests answered, by status", [*mv, "status"], registry=r
        )
        self.request_latency = Histogram(
            "rlserve_request_latency_seconds",
            "Request latency in the server, from its arrival to its answer",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.inference_latency = Histogram(
            "rl_inference_latency_seconds", "Model run time per batch (graph and policy heads)",
            mv, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "rlserve_queue_wait_seconds", "Time from admission to the start of its batch",
            mv, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.batch_rows = Histogram(
            "rlserve_batch_rows", "Rows per executed batch (before padding)",
            mv, buckets=ROW_BUCKETS, registry=r,
        )  # fmt: skip
        self.batch_fill = Histogram(
            "rlserve_batch_fill_ratio", "Rows per batch over max_batch_size",
            mv, buckets=FILL_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_rows = Gauge(
            "rlserve_queue_rows", "Rows waiting in the queue", ["model"],
            multiprocess_mode="livesum", registry=r,
        )  # fmt: skip
        self.pending_rows = Gauge(
            "rlserve_pending_rows", "Rows queued or executing: the per-pod scaling signal",
            multiprocess_mode="livesum", registry=r,
        )  # fmt: skip
        self.inflight = Gauge(
            "rlserve_inflight_requests", "Requests admitted to a queue and not yet answered",
            multiprocess_mode="livesum", registry=r,
        )  # fmt: skip
        self.rejections = Counter(
            "rlserve_rejections", "Requests refused, by reason", ["model", "reason"], registry=r
        )
        self.model_info = Gauge(
            "rlserve_model_info", "Loaded model versions and where they run",
            [*mv, "provider", "sha256"], multiprocess_mode="livemax", registry=r,
        )  # fmt: skip

        self.policy_version = Gauge(
            "rl_policy_version", "The active policy version per model (one series per worker)",
            ["model"], multiprocess_mode="liveall", registry=r,
        )  # fmt: skip
        self.update_load = Histogram(
            "rlserve_weight_update_load_seconds", "Building, checking and warming a new version",
            ["model"], buckets=UPDATE_BUCKETS, registry=r,
        )  # fmt: skip
        self.update_swap = Histogram(
            "rlserve_weight_update_swap_seconds", "Activating a loaded version",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.updates = Counter(
            "rlserve_weight_updates", "Version updates by result", ["model", "result"], registry=r
        )
        self.sink = MetricsSink(self)
        self._children: dict[tuple[Any, ...], Any] = {}
        self._load: dict[str, Load] = {}  # as last sampled, by model

    def child(self, metric: Any, *labels: str) -> Any:
        """A metric's label child, looked up once."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def refused(self, model: str, version: int | None, status: int, reason: str, s: float) -> None:
        """Count a request answered with an error (one at a time: the rare path)."""
        label = "" if version is None else str(version)
        self.child(self.requests, model, label, str(status)).inc()
        self.child(self.rejections, model, reason).inc()
        self.child(self.request_latency, model).observe(s)

    def sample_load(self, loads: dict[str, Load]) -> None:
        """Set the load gauges from the schedulers' current loads, by model."""
        for model, load in loads.items():
            if self._load.get(model) != load:
                self.child(self.queue_rows, model).set(load.queued_rows)
        self._load = dict(loads)
        self.pending_rows.set(sum(load.pending_rows for load in loads.values()))
        self.inflight.set(sum(load.requests for load in loads.values()))

    def version_loaded(self, model: str, version: int, provider: str, sha256: str) -> None:
        self.model_info.labels(model, str(version), provider, sha256).set(1)

    def version_unloaded(self, model: str, version: int, provider: str, sha256: str) -> None:
        self.model_info.remove(model, str(version), provider, sha256)

    def render(self) -> tuple[bytes, str]:
        """The exposition text of this process, or of every worker in multiprocess mode."""
        registry = CollectorRegistry()
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            MultiProcessCollector(registry)
        else:
            registry.register(self.registry)
        gpu = gpu_collector()
        if gpu is not None:
            registry.register(gpu)
        return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsSink:
    """Counts what one executed batch answered: a record sink (``serve.dataplane.record``)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._versions: dict[tuple[str, int], _VersionChildren] = {}

    def accept(self, record: BatchRecord) -> None:
        key = (record.model, record.version)
        children = self._versions.get(key)
        if children is None:
            children = self._versions[key] = _VersionChildren.of(self._metrics, *key)
        n = len(record.request_ids)
        children.answered.inc(n)
        observe_all(children.request_latency, [record.finished_at - t for t in record.received_at])
        observe_all(children.queue_wait, [record.started_at - t for t in record.enqueued_at])
        children.inference_latency.observe(record.run_s)
        children.batch_rows.observe(record.rows)
        children.batch_fill.observe(record.rows / record.max_rows)


@dataclass(frozen=True)
class _VersionChildren:
    """The label children one model version's batches update."""

    answered: Counter
    request_latency: Histogram
    inference_latency: Histogram
    queue_wait: Histogram
    batch_rows: Histogram
    batch_fill: Histogram

    @classmethod
    def of(cls, metrics: Metrics, model: str, version: int) -> _VersionChildren:
        labels = (model, str(version))
        return cls(
            metrics.child(metrics.requests, *labels, "200"),
            metrics.child(metrics.request_latency, model),
            metrics.child(metrics.inference_latency, *labels),
            metrics.child(metrics.queue_wait, *labels),
            metrics.child(metrics.batch_rows, *labels),
            metrics.child(metrics.batch_fill, *labels),
        )


def observe_all(child: Any, values: Sequence[float]) -> None:
    """``child.observe(v)`` for every value, as one update per bucket that gained any.

    Uses the histogram child's bucket values (``_upper_bounds``, ``_buckets``, ``_sum``),
    stable across prometheus_client releases for years; ``tests/serve/test_metrics.py``
    proves the result equal to observing one by one, so a release that changes them fails
    the tests rather than the counts.
    """
    bounds = child._upper_bounds
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    for bucket, count in zip(child._buckets, counts, strict=True):
        if count:
            bucket.inc(count)
    child._sum.inc(sum(values))
