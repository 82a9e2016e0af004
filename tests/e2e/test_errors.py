"""Every error answer, produced by a real request: a JSON error naming what was wrong."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.conftest import only
from tests.e2e.server import Server

GOOD = {"observations": [0.01, -0.02, 0.03, 0.04]}
TOKEN = "errors-test-token"
DEEP = orjson.loads(b"[" * 65 + b"0.5" + b"]" * 65)  # more axes than an array has


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code
    return str(error["message"])


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        (b'{"observations": [0.1, ', "malformed_request", "not valid JSON"),
        (b"[1, 2, 3]", "malformed_request", "must be a JSON object"),
    ],
)
def test_malformed_bodies_get_400(server: Server, body: bytes, code: str, words: str) -> None:
    with server.client() as client:
        assert words in error_of(client.post("/predict", content=body), 400, code)


def test_a_bad_timeout_header_gets_400(server: Server) -> None:
    with server.client() as client:
        response = client.post("/predict", json=GOOD, headers={"X-Request-Timeout-Ms": "soon"})
    assert "X-Request-Timeout-Ms" in error_of(response, 400, "malformed_request")


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/v1/models/nope/predict", "'nope'"),
        ("/v1/models/cartpole/versions/9/predict", "no version 9"),
        ("/v1/models/cartpole/versions/latest/predict", "ASCII digits only"),
    ],
)
def test_unknown_models_and_versions_get_404(server: Server, path: str, words: str) -> None:
    with server.client() as client:
        assert words in error_of(client.post(path, json=GOOD), 404, "not_found")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"observations": [0.1, 0.2, 0.3]}, "expected shape (4,)"),
        ({"observations": [0.0, True, 0.0, 0.0]}, "observations[1]: true is a boolean"),
        (
            {"observations": [[0.0] * 4, [0.0, 0.0, False, 0.0]], "deterministic": True},
            "[1][2]: false",
        ),
        ({"observations": [0.0, 1e39, 0.0, 0.0]}, "does not fit in float32"),
        ({"observations": ["a", 0, 0, 0]}, "expected numbers"),
        ({"observations": [[0.0] * 4] * 1025}, "queues at most 1024 (max_queue_rows)"),
        ({"obs": [0.0] * 4}, "unknown field(s) ['obs']"),
        ({"observations": [0.0] * 4, "seed": -1}, "seed: expected a non-negative integer"),
        ({"observations": [0.0] * 4, "outputs": ["everything"]}, "outputs: expected"),
        ({"observations": DEEP}, "observations: lists nested 65 deep; at most 64"),
        ({"observations": DEEP, "actions": [0]}, "observations: lists nested 65 deep; at most 64"),
    ],
)
def test_observations_that_do_not_fit_the_contract_get_422(
    server: Server, body: dict, words: str
) -> None:
    with server.client() as client:
        assert words in error_of(client.post("/predict", json=body), 422, "invalid_input")


def test_oversized_bodies_get_413(server: Server) -> None:
    with server.client() as client:
        response = client.post("/predict", content=b"[" + b"0," * 3_000_000 + b"0]")
    assert "max_body_bytes" in error_of(response, 413, "payload_too_large")


def test_a_passed_deadline_gets_504(server: Server) -> None:
    with server.client() as client:
        response = client.post("/predict", json=GOOD, headers={"X-Request-Timeout-Ms": "0.001"})
    assert "deadline" in error_of(response, 504, "deadline_exceeded")


def test_one_bad_request_never_fails_the_others(server: Server) -> None:
    bodies = [GOOD if i % 2 else {"observations": [9.0, 0, 0]} for i in range(64)]
    with server.client() as client, ThreadPoolExecutor(32) as pool:
        statuses = list(pool.map(lambda b: client.post("/predict", json=b).status_code, bodies))
    assert statuses == [422 if i % 2 == 0 else 200 for i in range(64)]


@pytest.fixture(scope="module")
def slow_server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Batches wait 300 ms and the queue holds 2 rows: easy to fill, easy to outwait."""
    tmp = tmp_path_factory.mktemp("slow")
    repo = only(repository, tmp, "cartpole", config="max_wait_ms: 300\nmax_queue_rows: 2\n")
    running = Server.rlserve(repo, env={"RLSERVE_ADMIN_TOKEN": TOKEN}, log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()


def test_a_full_queue_gets_429_with_retry_after(slow_server: Server) -> None:
    with slow_server.client() as client, ThreadPoolExecutor(3) as pool:
        first = [pool.submit(client.post, "/predict", json=GOOD) for _ in range(2)]
        time.sleep(0.1)  # both queued, waiting for company
        third = client.post("/predict", json=GOOD)
        assert [f.result().status_code for f in first] == [200, 200]
    assert "queue full" in error_of(third, 429, "queue_full")
    assert int(third.headers["Retry-After"]) >= 1


def test_a_request_that_expires_in_the_queue_is_never_run(slow_server: Server) -> None:
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with slow_server.client() as client:
        runs = slow_server.metric(client, "rlserve_batch_rows_count", model="cartpole")
        client.post("/v1/models/cartpole/hold", headers=admin).raise_for_status()
        response = client.post("/predict", json=GOOD, headers={"X-Request-Timeout-Ms": "50"})
        client.post("/v1/models/cartpole/resume", headers=admin).raise_for_status()
        time.sleep(0.4)  # past the batcher's wait: a request still queued would have run by now
        assert slow_server.metric(client, "rlserve_batch_rows_count", model="cartpole") == runs
    error_of(response, 504, "deadline_exceeded")


def test_unknown_routes_get_a_json_404(server: Server) -> None:
    with server.client() as client:
        error_of(client.get("/nowhere"), 404, "not_found")
