"""A rollout worker's Prometheus metrics, read from its counters when scraped.

The worker's loop only adds to plain integers (``loop.collect.Counters``); this collector
turns them into metric families at scrape time, so metrics cost the loop nothing:

    rl_env_steps_total{worker}             env steps recorded
    rl_experience_published_total{worker}  records the buffer accepted
    rl_episodes_total{worker}              episodes finished
    rl_worker_retries_total{worker,kind}   predict / publish tries that failed and were retried
    rl_episode_return{worker}              mean return of the last 100 finished episodes
    rl_worker_seconds_total{worker,phase}  time spent waiting for the server, stepping envs,
                                           publishing

Env steps per second is ``rate(rl_env_steps_total[1m])``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loop.collect import Counters


class WorkerCollector(Collector):
    def __init__(self, counters: Counters, worker: str) -> None:
        self.counters = counters
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        c, worker = self.counters, [self.worker]
        yield _counter("rl_env_steps", "Env steps recorded by the worker", worker, c.env_steps)
        yield _counter(
            "rl_experience_published", "Records the buffer accepted", worker, c.published
        )
        yield _counter("rl_episodes", "Episodes finished", worker, c.episodes)
        retries = CounterMetricFamily(
            "rl_worker_retries", "Tries that failed and were retried", labels=["worker", "kind"]
        )
        retries.add_metric([self.worker, "predict"], c.predict_retries)
        retries.add_metric([self.worker, "publish"], c.publish_retries)
        yield retries
        seconds = CounterMetricFamily(
            "rl_worker_seconds", "Time spent per phase of the loop", labels=["worker", "phase"]
        )
        for phase, value in (("predict", c.predict_s), ("env", c.env_s), ("publish", c.publish_s)):
            seconds.add_metric([self.worker, phase], value)
        yield seconds
        recent = c.recent_mean_return
        if recent is not None:
            gauge = GaugeMetricFamily(
                "rl_episode_return",
                "Mean return of the last 100 finished episodes",
                labels=["worker"],
            )
            gauge.add_metric(worker, recent)
            yield gauge


def _counter(name: str, documentation: str, worker: list[str], value: float) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=["worker"])
    family.add_metric(worker, value)
    return family


def serve_metrics(counters: Counters, worker: str, port: int, addr: str = "0.0.0.0") -> int:
    """Serve the worker's /metrics on ``port`` (0: any free port); the port it listens on."""
    registry = CollectorRegistry()
    registry.register(WorkerCollector(counters, worker))
    server, _ = start_http_server(port, addr=addr, registry=registry)
    return int(server.server_port)
