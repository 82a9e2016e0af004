"""gunicorn with 2 workers under a real locust run: replacing a worker, draining the server.

What counts as lost: a 5xx, or a request the server began to handle whose answer never
reached the client. A connection refused because the server no longer listens is not a
loss: the request was never accepted.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import orjson

from tests.e2e.server import Server
from tests.load.conftest import DEMO_REPOSITORY
from tests.load.gunicorn_server import (
    answered_by_worker,
    ready_workers,
    start_gunicorn,
    stop_gunicorn,
    wait_for_replacement,
    wait_for_traffic,
)
from tests.load.locust_runs import Locust

REFUSED = "ConnectionRefusedError(111, 'Connection refused')"


def test_sigterm_to_one_worker_mid_run_loses_no_request_and_gunicorn_replaces_it(
    gunicorn: Server, tmp_path: Path
) -> None:
    locust = Locust(gunicorn.url, tmp_path, "--max-fail-ratio", "0", seconds=8)
    victim = wait_for_traffic(tmp_path).most_common(1)[0][0]  # the busier worker
    os.kill(victim, signal.SIGTERM)
    wait_for_replacement(gunicorn, victim)
    run = locust.wait()
    assert run.code == 0, run.output
    assert run.failures == 0, run.errors()
    assert run.requests > answered_by_worker(tmp_path)[victim] > 0
    assert ready_workers(gunicorn) == 3  # the replacement loaded its models too


def test_draining_the_whole_server_mid_run_loses_no_accepted_request(tmp_path: Path) -> None:
    server = start_gunicorn(
        DEMO_REPOSITORY, tmp_path, RLSERVE_DRAIN_DELAY_S="0.5", RLSERVE_ACCESS_LOG="true"
    )
    try:
        locust = Locust(server.url, tmp_path, seconds=6)
        wait_for_traffic(tmp_path)
        server.send_signal(signal.SIGTERM)
        code = server.process.wait(30)
        run = locust.wait()
    finally:
        stop_gunicorn(server)
    handled = handled_predicts(server)
    errors = run.errors()
    assert code == 0, server.output()
    assert set(handled) == {200}, handled  # no 5xx, before, during or after the drain
    assert handled[200] == run.requests - run.failures  # every answer reached its client
    assert errors[REFUSED] > 0  # the run went on after the server had gone
    assert set(errors) <= {REFUSED, *NEVER_HANDLED}, errors


# While clients keep connecting to a server that stops listening, a few connections are
# reset or closed before the server has read their request: those the kernel still held in
# the listen queue when the last listener closed are reset, for one. Their requests never
# reached the server (the count of handled requests above proves it), so, like refused
# connections, they are not losses. Behind a load balancer clients do not see this: the
# preStop sleep and the drain delay stop new connections before the listeners close.
NEVER_HANDLED = {
    "ConnectionResetError(104, 'Connection reset by peer')",
    "HTTPConnectionClosed('connection closed.')",
}


def handled_predicts(server: Server) -> Counter[int]:
    """Statuses of the predict requests the server handled, from its access log."""
    assert server.log is not None
    statuses: Counter[int] = Counter()
    for line in server.log.read_text().splitlines():
        if line.startswith('{"request_id"'):
            record = orjson.loads(line)
            if record["path"].endswith("/predict"):
                statuses[record["status"]] += 1
    return statuses
