"""Prometheus metrics, correct under several gunicorn workers.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``serve/process/gunicorn_conf.py`` sets it before any worker
starts), every worker writes its values to files there and ``/metrics`` sums all workers;
gauges say how (``livesum``: the pod's total over live workers). Without it, the metrics
live in this process's registry.

Names: ``rlserve_*`` for the server's own; ``rl_inference_latency_seconds`` is the name
operators already query for model execution time per batch.

The request path touches no metric per request: answered requests, and their observations
outside the bounds (``Prepared.out_of_bounds``), are counted from each executed batch's
record (:class:`MetricsSink`, one update per batch and label set), the
load gauges are sampled from the schedulers a few times a second
(:meth:`Metrics.sample_load`, which also moves the batches' tallies into the metrics, as a
scrape does), and
only refused requests are counted one by one. Label
values are bounded: a model label names a served model (``""`` for requests naming none
that exists), a version label a loaded version.
"""

from __future__ import annotations

import bisect
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from kernel.errors import InvalidInput, RLServeError
from ops.gpu import gpu_collector
from serve.batching.record import BatchRecord
from serve.dataplane.kinds import ModelKind
from serve.dataplane.scheduler import Load

if TYPE_CHECKING:
    from serve.dataplane.model import ServedModel

# Seconds, with the resolution that matters for millisecond-scale policies.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0,
)  # fmt: skip
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FILL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
# Episode returns: their scale is the environment's, so decades both ways around 0.
_DECADES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 100000)
RETURN_BUCKETS = (*(-d for d in reversed(_DECADES)), 0, *_DECADES)
UPDATE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        disable_created_metrics()  # *_created series only double what scrapers store
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._declare_calls(r)
        self._declare_versions(r)
        self._declare_stores(r)
        self._declare_episodes(r)
        self.sink = MetricsSink(self)
        self._children: dict[tuple[Any, ...], Any] = {}
        self._refusals: dict[tuple[str, str, int, str], int] = {}  # not yet counted
        self._refusal_latency: dict[str, Tally] = {}
        self._load: dict[str, Load] = {}  # as last sampled, by model
        self._counts: dict[tuple[Any, ...], int] = {}  # (counter, *labels): not yet counted
        # Each kind's own sink and series, registered by the kind (serve.plugins).
        self.kinds: dict[ModelKind, Any] = {}

    def _declare_calls(self, r: CollectorRegistry) -> None:
        """Requests, latencies, batches, queues and refusals: every kind's calls."""
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
        self.out_of_bounds = Counter(
            "rlserve_observations_out_of_bounds",
            "Observations (rows) with a value outside their Box's declared bounds, as sent: "
            "served as given or clipped, or refused, as the model's observation_bounds says",
            ["model"], registry=r,
        )  # fmt: skip

    def _declare_versions(self, r: CollectorRegistry) -> None:
        """What is loaded where, and how version updates went."""
        mv = ("model", "version")
        self.model_info = Gauge(
            "rlserve_model_info", "Loaded model versions and where they run",
            [*mv, "provider", "sha256"], multiprocess_mode="livemax", registry=r,
        )  # fmt: skip
        self.provider_fallback = Gauge(
            "rlserve_provider_fallback",
            "1 when a GPU provider the settings name explicitly is not active for this "
            "version (onnxruntime fell back to another provider), else 0",
            mv, multiprocess_mode="livemax", registry=r,
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

    def _declare_stores(self, r: CollectorRegistry) -> None:
        """The result cache and the feature stores."""
        # The result cache (serve.stores.result_cache), tallied like refusals.
        self.result_cache_lookups = Counter(
            "rlserve_result_cache_lookups",
            "Result-cache lookups by result: hit, miss, error (Redis failed or timed out: "
            "the model answered), unavailable (not asked: it failed within the last second)",
            ["model", "result"], registry=r,
        )  # fmt: skip
        self.result_cache_writes = Counter(
            "rlserve_result_cache_writes",
            "Answers handed to the result cache, by result: stored, too_large, dropped "
            "(too many writes in flight, or Redis failed lately), error",
            ["model", "result"], registry=r,
        )  # fmt: skip
        # Online features (serve.stores.features): labels bounded to declared views.
        self.feature_lookups = Counter(
            "rlserve_feature_lookups",
            "Feature-store round trips by result: ok, error (failed or past its timeout)",
            ["model", "result"], registry=r,
        )  # fmt: skip
        self.feature_rows = Counter(
            "rlserve_feature_rows", "Entity rows read from the feature store", ["model"],
            registry=r,
        )  # fmt: skip
        self.feature_misses = Counter(
            "rlserve_feature_misses",
            "Features the store did not hold for a row (a default was used, or it was refused)",
            ["model", "feature"], registry=r,
        )  # fmt: skip
        self.feature_round_trips = Counter(
            "rlserve_feature_store_round_trips",
            "Round trips to a feature store (one serves every request queued since the last)",
            ["store"], registry=r,
        )  # fmt: skip
        self.feature_lookup_seconds = Histogram(
            "rlserve_feature_lookup_seconds",
            "A request's wait for its features, from asking to the answer",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip

    def _declare_episodes(self, r: CollectorRegistry) -> None:
        """Episodes their clients reported (serve.control.episodes): a canary's evidence."""
        mv = ("model", "version")
        self.episode_return = Histogram(
            "rlserve_episode_return", "Reported episode returns, by the version that served them",
            mv, buckets=RETURN_BUCKETS, registry=r,
        )  # fmt: skip
        # A histogram with negative buckets has no _sum (OpenMetrics): the mean comes from
        # this summary's _sum and _count.
        self.episode_returns = Summary(
            "rlserve_episode_returns",
            "Reported episode returns: _sum / _count is a version's mean return",
            mv, registry=r,
        )  # fmt: skip
        self.episodes = Counter(
            "rlserve_episodes",
            "Reported episodes, by how they ended (terminated, truncated, reported: neither said)",
            [*mv, "end"], registry=r,
        )  # fmt: skip
        self.canary_calls = Counter(
            "rlserve_canary_calls",
            "Calls a model's canary assigned: to the canary or the live side (arm), by the "
            "episode key they named (keyed) or at random (unkeyed: their episodes may mix)",
            ["model", "arm", "assignment"], registry=r,
        )  # fmt: skip
        # the latest judgement, from whichever worker judged last (livemostrecent)
        self.canary_verdict = Gauge(
            "rlserve_canary_verdict",
            "A model's canary, as its gate judged it last on every worker's episodes: 1 "
            "promote, 0 not decided yet, -1 roll back; NaN once it ended",
            ["model"], multiprocess_mode="livemostrecent", registry=r,
        )  # fmt: skip
        self.canary_difference = Gauge(
            "rlserve_canary_return_difference",
            "A canary's mean return minus the live version's: the gate's confidence "
            "sequence (lower, upper; +-Inf before min_episodes) and its estimate",
            ["model", "bound"], multiprocess_mode="livemostrecent", registry=r,
        )  # fmt: skip
        self.shadow_rows = Counter(
            "rlserve_canary_shadow_rows",
            "Rows a shadow canary was run on (mirrored live batches), by whether its action "
            "agreed with the live version's",
            ["model", "agreement"], registry=r,
        )  # fmt: skip
        self.canary_verdicts = Counter(
            "rlserve_canary_verdicts",
            "Canaries ended, by the verdict acted on (promote, rollback) and who acted",
            ["model", "verdict", "by"], registry=r,
        )  # fmt: skip

    def canary_judged(self, model: str, verdict: float, bounds: tuple[float, float, float]) -> None:
        """A canary's latest judgement on every worker's episodes: the verdict (1 promote,
        0 continue, -1 rollback) and the interval for canary - live (lower, estimate,
        upper); NaN once the canary ended."""
        self.child(self.canary_verdict, model).set(verdict)
        for bound, value in zip(("lower", "estimate", "upper"), bounds, strict=True):
            self.child(self.canary_difference, model, bound).set(value)

    def shadow_compared(self, model: str, rows: int, agreeing: int) -> None:
        """A shadow canary's comparison of a mirrored batch with the live version."""
        self.child(self.shadow_rows, model, "agree").inc(agreeing)
        self.child(self.shadow_rows, model, "disagree").inc(rows - agreeing)

    def canary_ended(self, model: str, verdict: str, by: str) -> None:
        """A model's canary ended on ``verdict``, acted on ``by`` its gate or a person: its
        judgement is no more."""
        self.child(self.canary_verdicts, model, verdict, by).inc()
        nan = float("nan")
        self.canary_judged(model, nan, (nan, nan, nan))

    def canary_assigned(self, model: str, arm: str, assignment: str) -> None:
        self.count_later(self.canary_calls, model, arm, assignment)

    def episode_reported(self, model: str, version: int, value: float, end: str) -> None:
        label = str(version)
        self.child(self.episode_return, model, label).observe(value)
        self.child(self.episode_returns, model, label).observe(value)
        self.child(self.episodes, model, label, end).inc()

    def child(self, metric: Any, *labels: str) -> Any:
        """A metric's label child, looked up once."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def refused(self, model: str, version: int | None, status: int, reason: str, s: float) -> None:
        """Count a request answered with an error. Under overload most answers are
        refusals: they are tallied here and counted at the next ``flush``, like batches."""
        key = (model, "" if version is None else str(version), status, reason)
        self._refusals[key] = self._refusals.get(key, 0) + 1
        latency = self._refusal_latency.get(model)
        if latency is None:
            latency = self._refusal_latency[model] = Tally.of(
                self.child(self.request_latency, model)
            )
        latency.add(s)

    def flush(self) -> None:
        """Move what was tallied since the last flush (batches, refusals) into the metrics."""
        self.sink.flush()
        for sink in self.kinds.values():
            if sink is not self.sink:
                sink.flush()
        refusals, self._refusals = self._refusals, {}
        for (model, version, status, reason), count in refusals.items():
            self.child(self.requests, model, version, str(status)).inc(count)
            self.child(self.rejections, model, reason).inc(count)
        for tally in self._refusal_latency.values():
            tally.flush()
        counts, self._counts = self._counts, {}
        for (metric, *labels), count in counts.items():
            self.child(metric, *labels).inc(count)

    def refused_error(
        self, model: str, version: int | None, status: int, error: RLServeError, s: float
    ) -> None:
        """Count a call answered with ``error``, whichever transport it came by, and the rows
        a bounds refusal (``observation_bounds: reject``) held."""
        self.refused(model, version, status, error.code.value, s)
        if isinstance(error, InvalidInput) and error.out_of_bounds:
            self.refused_out_of_bounds(model, error.out_of_bounds)

    def refused_out_of_bounds(self, model: str, rows: int) -> None:
        """Count the rows of a request refused for its bounds (``observation_bounds:
        reject``); those of served requests are counted from their batches."""
        self.child(self.out_of_bounds, model).inc(rows)

    def count_later(self, metric: Any, *labels: str) -> None:
        """Count one on a counter at the next ``flush`` (a call's count, without the
        counter's lock and child lookup per call)."""
        key = (metric, *labels)
        self._counts[key] = self._counts.get(key, 0) + 1

    def result_cache_lookup(self, model: str, result: str) -> None:
        """Count a result-cache lookup (``serve.stores.result_cache.Lookup``)."""
        self.count_later(self.result_cache_lookups, model, result)

    def result_cache_write(self, model: str, result: str) -> None:
        """Count an answer handed to the result cache (``result_cache.Write``)."""
        self.count_later(self.result_cache_writes, model, result)

    def answered_from_cache(self, model: str, version: int, seconds: float, rows_out: int) -> None:
        """Count a request answered from the result cache as its batch would have counted
        it (answered, its latency, its observations outside the bounds), with no batch."""
        self.sink.answered_alone(model, version, seconds, rows_out)

    def sample_load(self, loads: dict[str, Load]) -> None:
        """Set the load gauges from the schedulers' current loads, by model, and move what
        the batches since the last sample answered into the request metrics."""
        self.flush()
        for model, load in loads.items():
            if self._load.get(model) != load:
                self.child(self.queue_rows, model).set(load.queued_rows)
        self._load = dict(loads)
        self.pending_rows.set(sum(load.pending_rows for load in loads.values()))
        self.inflight.set(sum(load.requests for load in loads.values()))

    def version_loaded(self, model: str, loaded: ServedModel) -> None:
        """A version of ``model`` loaded: where it runs, and whether a GPU provider the
        settings name is not active for it (its session's ``ProviderReport.missing``)."""
        version = str(loaded.version)
        self.model_info.labels(model, version, loaded.provider, loaded.sha256).set(1)
        self.provider_fallback.labels(model, version).set(
            1 if loaded.provider_report.missing else 0
        )

    def version_unloaded(self, model: str, version: int, provider: str, sha256: str) -> None:
        """Retire an unloaded version's series, so they do not pile up as versions come and
        go (what it answered was flushed first and stays in ``rlserve_requests_total``'s
        history up to now)."""
        self.sink.forget(model, version)
        self.model_info.remove(model, str(version), provider, sha256)
        # Under gunicorn a removed series stays in the worker's file: leave it at 0 there.
        self.provider_fallback.labels(model, str(version)).set(0)
        self.provider_fallback.remove(model, str(version))
        label = str(version)
        for key in [k for k in self._children if k[1:3] == (model, label)]:
            metric = key[0]
            if metric is not self.requests:  # keep the counts of what it answered
                metric.remove(*key[1:])
            del self._children[key]

    def exposition(self) -> tuple[bytes, str]:
        """The exposition text of this process, or of every worker in multiprocess mode, as
        it stands: flush the sink first, on the event loop (this may run off it)."""
        for _ in range(2):
            try:
                return self._exposition()
            except struct.error:  # another worker was creating its file this instant
                time.sleep(0.01)
        return self._exposition()

    def _exposition(self) -> tuple[bytes, str]:
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
    """Counts what each executed batch answered: a record sink (``serve.batching.record``).

    A batch only adds to plain tallies (no locks, no shared memory); :meth:`flush` moves
    them into the Prometheus metrics. The process flushes with the load gauges a few times
    a second and before every scrape it answers, so counts are at most that old.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._versions: dict[tuple[str, int], _VersionTally] = {}

    def accept(self, record: BatchRecord) -> None:
        key = (record.model, record.version)
        tally = self._versions.get(key)
        if tally is None:
            tally = self._versions[key] = _VersionTally.of(self._metrics, *key)
        tally.answered += len(record.request_ids)
        for request in record.requests:
            tally.out_of_bounds += request.out_of_bounds
        finished, started = record.finished_at, record.started_at
        for received in record.received_at:
            tally.request_latency.add(finished - received)
        for enqueued in record.enqueued_at:
            tally.queue_wait.add(started - enqueued)
        tally.inference_latency.add(record.run_s)
        tally.batch_rows.add(record.rows)
        tally.batch_fill.add(record.rows / record.max_rows)

    def answered_alone(self, model: str, version: int, seconds: float, rows_out: int) -> None:
        """A request answered without running a batch (a result-cache hit)."""
        key = (model, version)
        tally = self._versions.get(key)
        if tally is None:
            tally = self._versions[key] = _VersionTally.of(self._metrics, *key)
        tally.answered += 1
        tally.out_of_bounds += rows_out
        tally.request_latency.add(seconds)

    def flush(self) -> None:
        for tally in self._versions.values():
            tally.flush()

    def forget(self, model: str, version: int) -> None:
        """An unloaded version: flush what it answered, then drop its tallies."""
        tally = self._versions.pop((model, version), None)
        if tally is not None:
            tally.flush()


@dataclass
class Tally:
    """Observations of one histogram child not yet moved into it."""

    child: Any
    counts: list[int]
    total: float = 0.0

    @classmethod
    def of(cls, child: Any) -> Tally:
        return cls(child, [0] * len(child._upper_bounds))

    def add(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.child._upper_bounds, value)] += 1
        self.total += value

    def flush(self) -> None:
        if any(self.counts):
            add_counts(self.child, self.counts, self.total)
            self.counts = [0] * len(self.counts)
            self.total = 0.0


@dataclass
class _VersionTally:
    """What one model version's batches answered since the last flush."""

    requests: Any  # the counter child of answered requests
    request_latency: Tally
    inference_latency: Tally
    queue_wait: Tally
    batch_rows: Tally
    batch_fill: Tally
    out_of_bounds_rows: Any  # the model's counter child of rows outside the bounds
    answered: int = 0
    out_of_bounds: int = 0

    @classmethod
    def of(cls, metrics: Metrics, model: str, version: int) -> _VersionTally:
        labels = (model, str(version))
        return cls(
            metrics.child(metrics.requests, *labels, "200"),
            Tally.of(metrics.child(metrics.request_latency, model)),
            Tally.of(metrics.child(metrics.inference_latency, *labels)),
            Tally.of(metrics.child(metrics.queue_wait, *labels)),
            Tally.of(metrics.child(metrics.batch_rows, *labels)),
            Tally.of(metrics.child(metrics.batch_fill, *labels)),
            metrics.child(metrics.out_of_bounds, model),  # the series exists from the start
        )

    def flush(self) -> None:
        if self.answered:
            self.requests.inc(self.answered)
            self.answered = 0
        if self.out_of_bounds:
            self.out_of_bounds_rows.inc(self.out_of_bounds)
            self.out_of_bounds = 0
        for tally in (
            self.request_latency,
            self.inference_latency,
            self.queue_wait,
            self.batch_rows,
            self.batch_fill,
        ):
            tally.flush()


def add_counts(child: Any, counts: Sequence[int], total: float) -> None:
    """Add observations already sorted into the histogram child's buckets.

    Uses the child's bucket values (``_upper_bounds``, ``_buckets``, ``_sum``), stable
    across prometheus_client releases for years; ``tests/serve/test_metrics.py`` proves the
    result equal to observing one by one, so a release that changes them fails the tests
    rather than the counts.
    """
    for bucket, count in zip(child._buckets, counts, strict=True):
        if count:
            bucket.inc(count)
    child._sum.inc(total)
