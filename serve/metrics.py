"""Prometheus metrics, correct under several gunicorn workers.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``serve/gunicorn.conf.py`` sets it before any worker
starts), every worker writes its values to files there and ``/metrics`` sums all workers;
gauges say how (``livesum``: the pod's total over live workers). Without it, the metrics
live in this process's registry.

Names: ``rlserve_*`` for the server's own; ``rl_inference_latency_seconds`` is the name
operators already query for model execution time per batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
        self._request_children: dict[tuple[str, int | None, int], Counter] = {}
        r = self.registry
        mv = ("model", "version")
        self.requests = Counter(
            "rlserve_requests", "Requests answered, by status", [*mv, "status"], registry=r
        )
        self.request_latency = Histogram(
            "rlserve_request_latency_seconds", "End-to-end request latency in the server",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.inference_latency = Histogram(
            "rl_inference_latency_seconds", "onnxruntime run time per batch",
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
            "rlserve_inflight_requests", "Requests being handled",
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

    def count(self, model: str, version: int | None, status: int) -> None:
        """Count an answered request (label children cached: this runs per request)."""
        key = (model, version, status)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(
                model, "" if version is None else str(version), str(status)
            )
            self._request_children[key] = child
        child.inc()

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


@dataclass(frozen=True)
class VersionMetrics:
    """The label children of one model version, looked up once instead of per batch."""

    inference_latency: Histogram
    queue_wait: Histogram
    batch_rows: Histogram
    batch_fill: Histogram

    @classmethod
    def of(cls, metrics: Metrics, model: str, version: int) -> VersionMetrics:
        labels = (model, str(version))
        return cls(
            metrics.inference_latency.labels(*labels),
            metrics.queue_wait.labels(*labels),
            metrics.batch_rows.labels(*labels),
            metrics.batch_fill.labels(*labels),
        )
