"""/metrics of a gunicorn server sums its workers (PROMETHEUS_MULTIPROC_DIR per test)."""

from __future__ import annotations

import time
from pathlib import Path

from serve.process.app import LOAD_SAMPLE_S
from tests.e2e.server import Server
from tests.load.fresh_connections import FreshConnections
from tests.load.gunicorn_server import answered, worker_pids

SENT = 240


def test_requests_total_on_metrics_equals_the_requests_sent_across_both_worker_pids(
    gunicorn: Server, tmp_path: Path
) -> None:
    results = FreshConnections(gunicorn.url, threads=4, per_thread=SENT // 4).join()
    time.sleep(2 * LOAD_SAMPLE_S)  # every worker has moved its batches' tallies into metrics
    with gunicorn.client(headers={"Connection": "close"}) as client:
        scraped = [gunicorn.metric(client, "rlserve_requests_total") for _ in range(6)]
    by_worker = answered(tmp_path)
    assert results == {"200": SENT}
    assert scraped == [SENT] * 6  # whichever worker answers the scrape
    assert {pid for pid, _ in by_worker} == {str(pid) for pid in worker_pids(gunicorn)}
    assert all(count > 0 for count in by_worker.values()), by_worker
    assert sum(by_worker.values()) == SENT
