"""Readiness during warm-up, liveness, and draining on SIGTERM under load."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import only
from tests.e2e.server import Server

GOOD = {"observations": [0.01, -0.02, 0.03, 0.04]}


def test_ready_is_red_until_warm_up_ends_while_health_is_green(
    repository: Path, tmp_path: Path
) -> None:
    # A wide MLP warmed at every batch size up to 1024 takes a while to become ready.
    repo = only(repository, tmp_path, "heavy", config="max_batch_size: 1024\n")
    server = Server.rlserve(repo, log=tmp_path / "log")
    try:
        server.wait_listening()
        with server.client() as client:
            health = client.get("/health")
            early = client.get("/ready")
            refused = client.post("/predict", json=GOOD)
        server.wait_ready()
        with server.client() as client:
            late = client.get("/ready")
    finally:
        server.stop()
    assert health.status_code == 200
    assert early.status_code == 503
    assert "loading models" in early.json()["reasons"]
    assert refused.status_code == 503
    assert late.status_code == 200


def test_sigterm_drains_without_losing_an_accepted_request(
    repository: Path, tmp_path: Path
) -> None:
    repo = only(repository, tmp_path, "cartpole")
    server = Server.rlserve(repo, "--drain-delay-s", "1", log=tmp_path / "log")
    server.wait_ready()
    results: list[str] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            while not stop.is_set():
                try:
                    results.append(str(client.post("/predict", json=GOOD).status_code))
                except httpx.TransportError as exc:  # judged below against the server's log
                    results.append(type(exc).__name__)
                    time.sleep(0.01)

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    server.send_signal(signal.SIGTERM)
    with httpx.Client(base_url=server.url, timeout=5) as probe:
        draining_ready = probe.get("/ready").status_code
        draining_predict = probe.post("/predict", json=GOOD).status_code
    code = server.process.wait(30)
    stop.set()
    for t in threads:
        t.join()
    # Accepted = read by the server: every such request has an access-log line, and was
    # answered 200. A connection the server never read from (refused, or reset while still
    # in the kernel's accept queue at the final close) is no loss: the request never arrived.
    served = [line for line in server.output(full=True).splitlines() if '"path":"/predict"' in line]
    assert draining_ready == 503
    assert draining_predict == 200
    assert all('"status":200' in line for line in served)
    assert results.count("200") + 1 == len(served), "a request the server read got no answer"
    assert not [r for r in results if r.isdigit() and r != "200"]
    assert results.count("200") > 50
    assert code in (0, -signal.SIGTERM)


@pytest.mark.parametrize("missing", ["does-not-exist"])
def test_serving_a_missing_repository_fails_fast_with_one_line(
    tmp_path: Path, missing: str
) -> None:
    server = Server.rlserve(tmp_path / missing, log=tmp_path / "log")
    code = server.process.wait(30)
    server.stop()
    assert code == 2
    assert "is not a directory" in server.output()


def test_a_requested_gpu_provider_that_is_not_active_keeps_ready_red(
    repository: Path, tmp_path: Path
) -> None:
    repo = only(repository, tmp_path, "cartpole")
    providers = {"RLSERVE_PROVIDERS": '["CUDAExecutionProvider", "CPUExecutionProvider"]'}
    strict = Server.rlserve(repo, env=providers, log=tmp_path / "strict.log")
    try:
        strict.wait_until(lambda c: c.get("/ready").json()["phase"] == "ready", 30, "loaded")
        with strict.client() as client:
            ready = client.get("/ready")
    finally:
        strict.stop()
    assert ready.status_code == 503
    assert "CUDAExecutionProvider" in " ".join(ready.json()["reasons"])
    assert "allow_cpu_fallback" in strict.output()
    lenient = Server.rlserve(
        repo, "--allow-cpu-fallback", env=providers, log=tmp_path / "lenient.log"
    )
    try:
        lenient.wait_ready()
    finally:
        lenient.stop()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_idle_server_stops_in_under_a_second_and_frees_its_port(
    repository: Path, tmp_path: Path, sig: int
) -> None:
    """No drain delay unless configured (the Kubernetes manifests set one)."""
    repo = only(repository, tmp_path, "cartpole")
    first = Server.rlserve(repo, log=tmp_path / "first.log")
    first.wait_ready()
    started = time.monotonic()
    first.stop(sig)  # exits 130 on SIGINT; on SIGTERM uvicorn re-raises it once shut down
    took = time.monotonic() - started
    # The same port again, at once (flags win over the RLSERVE_PORT the harness sets).
    second = Server.rlserve(repo, "--port", str(first.port), log=tmp_path / "second.log")
    second.url = first.url
    try:
        second.wait_ready()
    finally:
        second.stop()
    assert "rlserve.app: stopped" in first.output(full=True)  # a graceful stop, not a kill
    assert took < 1.0, f"stopping an idle server took {took:.2f}s"


def test_a_quiet_start_logs_no_error_and_still_writes_access_lines(
    repository: Path, tmp_path: Path
) -> None:
    """``log_level: warning`` keeps a clean start silent (no "not ready" while the canaries
    start: readiness is judged once they have), and ``access_log`` still writes each
    request's line: the two settings are independent."""
    repo = only(repository, tmp_path, "cartpole")
    server = Server.rlserve(repo, "--log-level", "warning", log=tmp_path / "log")
    try:
        server.wait_ready()
        with server.client() as client:
            answered = client.post("/predict", json=GOOD, headers={"X-Request-Id": "quiet-1"})
    finally:
        server.stop()
    assert answered.status_code == 200
    lines = server.output(full=True).splitlines()
    assert [line for line in lines if " ERROR " in line] == []
    (access,) = [json.loads(line) for line in lines if "quiet-1" in line]
    assert (access["path"], access["status"]) == ("/predict", 200)


def test_sigterm_answers_every_request_written_on_a_keep_alive_connection(
    repository: Path, tmp_path: Path
) -> None:
    """Clients on keep-alive connections write their next request at any moment, also while
    the server stops (no drain delay): each written request is answered, or its connection
    was refused before anything was written."""
    server = Server.rlserve(only(repository, tmp_path, "cartpole"), log=tmp_path / "log")
    server.wait_ready()
    outcomes: Counter[str] = Counter()
    stop = threading.Event()
    body = json.dumps(GOOD)

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        while not stop.is_set():
            try:
                connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
            except OSError as exc:  # nothing was written: the server had stopped listening
                outcomes[f"not sent: {type(exc).__name__}"] += 1
                connection.close()
                time.sleep(0.01)
                continue
            try:
                response = connection.getresponse()
                response.read()
                outcomes[str(response.status)] += 1
            except (OSError, http.client.HTTPException) as exc:
                outcomes[f"lost: {type(exc).__name__}"] += 1
                connection.close()

    threads = [threading.Thread(target=client) for _ in range(16)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.7)
        server.send_signal(signal.SIGTERM)
        server.process.wait(30)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        server.stop()
    assert not [o for o in outcomes if o.startswith("lost")], outcomes
    # A request whose write failed (refused; or reset, when the drain closed an idle
    # keep-alive connection as the client began to write on it: HTTP's keep-alive race) was
    # never accepted, and its client knows: only answers and such failed sends may happen.
    sent = {o for o in outcomes if not o.startswith("not sent: ")}
    assert sent <= {"200"}, outcomes
    assert set(outcomes) - sent <= {
        "not sent: ConnectionRefusedError",
        "not sent: ConnectionResetError",
        "not sent: BrokenPipeError",
    }, outcomes
    assert outcomes["200"] > 100
