"""A worker that gunicorn starts takes connections only once its models are loaded.

gunicorn's workers share one listening socket; a worker that listened while loading would
answer its share of new connections 503 although its siblings were ready.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.load.conftest import DEMO_REPOSITORY
from tests.load.fresh_connections import FreshConnections
from tests.load.gunicorn_server import (
    answered_by_worker,
    ready_workers,
    start_gunicorn,
    stop_gunicorn,
    wait_for_replacement,
    worker_pids,
)

VERSIONS = 300  # copies of the demo policy, loaded one after the other: a slow start


def slow_loading_repository(tmp: Path) -> Path:
    model = tmp / "repository" / "cartpole"
    for version in range(1, VERSIONS + 1):
        (model / str(version)).mkdir(parents=True)
        (model / str(version) / "model.onnx").symlink_to(DEMO_REPOSITORY / "cartpole/1/model.onnx")
    (model / "config.yaml").write_text(f"version_policy:\n  latest: {VERSIONS}\n")
    return model.parent


def test_a_replaced_worker_takes_no_connection_before_its_models_are_loaded(
    tmp_path: Path,
) -> None:
    server = start_gunicorn(
        slow_loading_repository(tmp_path), tmp_path, RLSERVE_DRAIN_DELAY_S="0.2"
    )
    traffic = FreshConnections(server.url, threads=4)
    try:
        victim = min(worker_pids(server))
        os.kill(victim, signal.SIGTERM)
        replacement = wait_for_replacement(server, victim)
        server.wait_until(lambda _: ready_workers(server) == 3, 60, "ready in the replacement")
        time.sleep(1.0)  # new connections now reach the replacement too
    finally:
        results = traffic.stop()
        stop_gunicorn(server)
    assert set(results) == {"200"}, results
    assert answered_by_worker(tmp_path)[replacement] > 0
