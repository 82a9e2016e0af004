"""A rollout worker's metrics: its counters as Prometheus families, served over HTTP."""

from __future__ import annotations

from collections import deque

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from loop.collect import Counters
from loop.worker_metrics import WorkerCollector, serve_metrics


def test_the_counters_become_metric_families() -> None:
    counters = Counters(env_steps=120, episodes=3, published=118, predict_retries=2)
    counters.recent_returns = deque([10.0, 20.0, 30.0])
    registry = CollectorRegistry()
    registry.register(WorkerCollector(counters, "w0"))
    text = generate_latest(registry).decode()
    assert 'rl_env_steps_total{worker="w0"} 120.0' in text
    assert 'rl_experience_published_total{worker="w0"} 118.0' in text
    assert 'rl_episodes_total{worker="w0"} 3.0' in text
    assert 'rl_worker_retries_total{kind="predict",worker="w0"} 2.0' in text
    assert 'rl_episode_return{worker="w0"} 20.0' in text


def test_a_worker_without_finished_episodes_has_no_return_yet() -> None:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(Counters(), "w0"))
    assert "rl_episode_return{" not in generate_latest(registry).decode()


def test_metrics_are_read_when_scraped() -> None:
    counters = Counters()
    port = serve_metrics(counters, "w1", 0, addr="127.0.0.1")
    counters.env_steps = 7  # the worker's loop adds; the scrape reads the value now
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'rl_env_steps_total{worker="w1"} 7.0' in text
