"""The predict routes answer the same through both HTTP paths: the protocol's direct cycle
(``http_data_plane: protocol``, the default) and uvicorn's ASGI cycle (``asgi``).

Every error case is sent to two servers of the same model, one per path, and their answers
compared: status, headers (but Date and the request id) and body, byte for byte.
"""

from __future__ import annotations

import re
import signal
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import only
from tests.e2e.server import Server

GOOD = b'{"observations": [0.01, -0.02, 0.03, 0.04]}'
PATHS = ("protocol", "asgi")
MAX_BODY = 100_000
# A model whose batches wait 300 ms and whose queue holds 2 rows: easy to fill.
SLOW = "max_wait_ms: 300\nmax_queue_rows: 2\n"
_UNCOMPARED = {"date", "x-request-id"}
_HEAD = (
    b'{"inputs": [{"name": "observations", "shape": [1, 4], "datatype": "FP32",'
    b' "parameters": {"binary_data_size": 16}}], "parameters": {"binary_data_output": true}}'
)
BINARY = _HEAD + struct.pack("<4f", 0.01, -0.02, 0.03, 0.04)
BINARY_HEADERS = {"inference-header-content-length": str(len(_HEAD))}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @classmethod
    def of(cls, response: httpx.Response) -> Answer:
        headers = {k: v for k, v in response.headers.items() if k not in _UNCOMPARED}
        return cls(response.status_code, headers, response.content)


def serve(repo: Path, tmp: Path, path: str, *flags: str) -> Server:
    return Server.rlserve(
        repo, "--http-data-plane", path, "--max-body-bytes", str(MAX_BODY), *flags,
        log=tmp / f"{path}.log",
    )  # fmt: skip


@pytest.fixture(scope="module")
def servers(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """One server per HTTP path on the same slow cartpole."""
    tmp = tmp_path_factory.mktemp("paths")
    repo = only(repository, tmp, "cartpole", config=SLOW)
    running = [serve(repo, tmp, path) for path in PATHS]
    try:
        for server in running:
            server.wait_ready()
        yield running
    finally:
        for server in running:
            server.stop()


CASES = {
    "good": ("POST", "/predict", GOOD, {}),
    "bad JSON": ("POST", "/predict", b'{"observations": [0.1, ', {}),
    "not an object": ("POST", "/predict", b"[1, 2, 3]", {}),
    "wrong shape": ("POST", "/predict", b'{"observations": [0.1, 0.2, 0.3]}', {}),
    "a boolean": ("POST", "/predict", b'{"observations": [0.0, true, 0.0, 0.0]}', {}),
    "unknown field": ("POST", "/predict", b'{"obs": [0.0, 0.0, 0.0, 0.0]}', {}),
    "bad seed": ("POST", "/predict", b'{"observations": [0, 0, 0, 0], "seed": -1}', {}),
    "too large": ("POST", "/predict", b"[" + b"0," * MAX_BODY + b"0]", {}),
    "passed deadline": ("POST", "/predict", GOOD, {"x-request-timeout-ms": "0.001"}),
    "bad timeout": ("POST", "/predict", GOOD, {"x-request-timeout-ms": "soon"}),
    "unknown model": ("POST", "/v1/models/nope/predict", GOOD, {}),
    "unknown version": ("POST", "/v1/models/cartpole/versions/9/predict", GOOD, {}),
    "bad version": ("POST", "/v1/models/cartpole/versions/latest/predict", GOOD, {}),
    "version": ("POST", "/v1/models/cartpole/versions/1/predict", GOOD, {}),
    "GET": ("GET", "/predict", b"", {}),
    "closing": ("POST", "/predict", GOOD, {"connection": "close"}),
    "/v2 JSON": (
        "POST",
        "/v2/models/cartpole/infer",
        b'{"inputs": [{"name": "observations", "shape": [1, 4], "datatype": "FP32",'
        b' "data": [0, 0, 0, 0]}]}',
        {},
    ),
    "/v2 unknown": ("POST", "/v2/models/nope/infer", b"{}", {}),
    "/v2 bad JSON": ("POST", "/v2/models/cartpole/infer", b'{"inputs": [', {}),
    "/v2 wrong shape": (
        "POST",
        "/v2/models/cartpole/infer",
        b'{"inputs": [{"name": "observations", "shape": [1, 3], "datatype": "FP32",'
        b' "data": [0, 0, 0]}]}',
        {},
    ),
    "/v2 binary": ("POST", "/v2/models/cartpole/infer", BINARY, BINARY_HEADERS),
    "/v2 unknown region": (
        "POST",
        "/v2/models/cartpole/infer",
        b'{"inputs": [{"name": "observations", "shape": [1, 4], "datatype": "FP32",'
        b' "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 16}}]}',
        {},
    ),
    "/v2 passed deadline": (
        "POST",
        "/v2/models/cartpole/infer",
        b'{"inputs": [{"name": "observations", "shape": [1, 4], "datatype": "FP32",'
        b' "data": [0, 0, 0, 0]}]}',
        {"x-request-timeout-ms": "0.001"},
    ),
}


def send(server: Server, case: str) -> Answer:
    method, path, body, headers = CASES[case]
    with server.client() as client:
        return Answer.of(client.request(method, path, content=body, headers=headers))


@pytest.mark.parametrize("case", list(CASES))
def test_both_paths_answer_alike(servers: list[Server], case: str) -> None:
    direct, asgi = (send(server, case) for server in servers)
    assert direct == asgi
    assert direct.status != 500


def test_a_full_queue_gets_the_same_429(servers: list[Server]) -> None:
    answers = []
    for server in servers:
        with server.client() as client, ThreadPoolExecutor(2) as pool:
            first = [pool.submit(client.post, "/predict", content=GOOD) for _ in range(2)]
            server.wait_until(partial(_holds_two, server), 10, "holding 2 rows")
            answers.append(Answer.of(client.post("/predict", content=GOOD)))
            assert [f.result().status_code for f in first] == [200, 200]
    direct, asgi = answers
    assert direct.status == asgi.status == 429
    assert direct.headers == asgi.headers
    # the message names the measured wait, which is each process's own
    assert _numbers_out(direct.body) == _numbers_out(asgi.body)


def test_connections_close_alike_while_draining(repository: Path, tmp_path: Path) -> None:
    repo = only(repository, tmp_path, "cartpole")
    running = [serve(repo, tmp_path, path, "--drain-delay-s", "5") for path in PATHS]
    answers = []
    try:
        for server in running:
            server.wait_ready()
            server.send_signal(signal.SIGTERM)
            server.wait_until(lambda c: c.get("/ready").status_code == 503, 5, "draining")
            answers.append(send(server, "good"))
    finally:
        for server in running:
            server.stop()
    direct, asgi = answers
    assert direct == asgi
    assert direct.status == 200
    assert direct.headers["connection"] == "close"


def test_a_loading_model_gets_the_same_503(repository: Path, tmp_path: Path) -> None:
    # A wide MLP warmed at every batch size up to 1024 takes a while to become ready; each
    # server is asked as soon as it listens, one after the other (two warming at once
    # left the first ready before the second listened).
    repo = only(repository, tmp_path, "heavy", config="max_batch_size: 1024\n")
    answers = []
    for path in PATHS:
        server = serve(repo, tmp_path, path)
        try:
            server.wait_listening()
            answers.append(send(server, "good"))
        finally:
            server.stop()
    assert answers[0] == answers[1]
    assert answers[0].status == 503


def _holds_two(server: Server, client: httpx.Client) -> bool:
    return server.metric(client, "rlserve_queue_rows", model="cartpole") == 2


def _numbers_out(body: bytes) -> bytes:
    return re.sub(rb"\d+(\.\d+)?", b"N", body)
