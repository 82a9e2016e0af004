"""Refusals under overload cost little and break nothing: a call its model would refuse is
answered 429 (from its headers while refusals go on), its connection is read again after the
Retry-After (a call sent before then waits unread and is judged from when the wait began),
and the connection goes on serving."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

from client import PolicyClient
from tests.e2e.conftest import only
from tests.e2e.server import Server

TOKEN = "overload-test-token"
OBS = [0.01, -0.02, 0.03, 0.04]
CONFIG = "max_queue_rows: 2\ndefault_deadline_ms: 20000\n"  # the held calls wait it out


def test_a_refused_call_is_answered_from_its_headers_and_the_connection_lives_on(
    repository: Path, tmp_path: Path
) -> None:
    repo = only(repository, tmp_path, "cartpole", config=CONFIG)
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
            budgets = (None, "500", None, None)  # X-Request-Timeout-Ms of each call
            refusals, took, took_elsewhere = [], [], []
            answers: list[http.client.HTTPResponse] = []
            for budget in budgets:
                sent = headers if budget is None else {**headers, "X-Request-Timeout-Ms": budget}
                started = time.monotonic()
                connection.request("POST", "/predict", body, sent)  # its body skipped
                refused = connection.getresponse()
                refusals.append((refused.status, json.loads(refused.read())))
                took.append(time.monotonic() - started)
                answers.append(refused)
                started = time.monotonic()
                elsewhere = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
                elsewhere.request("POST", "/predict", body, headers)  # a new connection
                took_elsewhere.append((elsewhere.getresponse().status, time.monotonic() - started))
                elsewhere.close()
            admin.resume("cartpole")
            for waiter in waiters:
                waiter.join(5)
            time.sleep(1.1)  # the Retry-After
            connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
            served = connection.getresponse()
            served_body = json.loads(served.read())
            connection.close()
    finally:
        server.stop()
    # after a 429 the connection is not read for a second, each call being sent at once:
    # the 2nd waits it out and its 500 ms have passed (504: no pause after it); the 3rd is
    # refused from its headers (429); the 4th waits it out, still within its 20 s (429)
    assert [status for status, _ in refusals] == [429, 504, 429, 429]
    assert all(status == 429 and seconds < 0.5 for status, seconds in took_elsewhere)
    assert [seconds > 0.9 for seconds in took] == [False, True, False, True]
    assert refusals[0][1]["error"]["code"] == "queue_full"
    assert refusals[1][1]["error"]["code"] == "deadline_exceeded"
    assert "500 ms passed" in refusals[1][1]["error"]["message"]
    assert "queue full" in refusals[0][1]["error"]["message"]
    assert answers[0].getheader("retry-after") is not None
    assert answers[0].getheader("x-request-id") == "refused-1"
    assert (served.status, served_body["model_version"]) == (200, 1)
    assert queued == [1, 1]
