"""Refusals under overload cost little and break nothing: a call its model would refuse is
answered 429 from its headers, and the connection goes on serving."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

from serve.client import PolicyClient
from tests.e2e.conftest import only
from tests.e2e.server import Server

TOKEN = "overload-test-token"
OBS = [0.01, -0.02, 0.03, 0.04]


def test_a_refused_call_is_answered_from_its_headers_and_the_connection_lives_on(
    repository: Path, tmp_path: Path
) -> None:
    repo = only(repository, tmp_path, "cartpole", config="max_queue_rows: 2\n")
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN}
    server = Server.rlserve(repo, env=env, log=tmp_path / "log")
    server.wait_ready()
    try:
        with PolicyClient(server.url, admin_token=TOKEN) as admin:
            admin.hold("cartpole")
            queued: list[int] = []
            waiters = [
                threading.Thread(target=lambda: queued.append(admin.predict(OBS).model_version))
                for _ in range(2)
            ]
            for waiter in waiters:
                waiter.start()
            server.wait_until(
                lambda c: server.metric(c, "rlserve_queue_rows", model="cartpole") == 2,
                5,
                "holding two queued rows",
            )
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            body = json.dumps({"observations": OBS})
            headers = {"Content-Type": "application/json", "X-Request-Id": "refused-1"}
            refusals = []
            for _ in range(3):  # the same connection, its bodies skipped each time
                connection.request("POST", "/predict", body, headers)
                refused = connection.getresponse()
                refusals.append((refused.status, json.loads(refused.read())))
            answer = refused
            admin.resume("cartpole")
            for waiter in waiters:
                waiter.join(5)
            connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
            served = connection.getresponse()
            served_body = json.loads(served.read())
            connection.close()
    finally:
        server.stop()
    assert [status for status, _ in refusals] == [429, 429, 429]
    assert refusals[0][1]["error"]["code"] == "queue_full"
    assert "queue full" in refusals[0][1]["error"]["message"]
    assert answer.getheader("retry-after") is not None
    assert answer.getheader("x-request-id") == "refused-1"
    assert (served.status, served_body["model_version"]) == (200, 1)
    assert queued == [1, 1]
