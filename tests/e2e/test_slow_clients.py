"""Clients that send slowly or never finish cannot hold connections: 408, then closed."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import only
from tests.e2e.server import Server

TIMEOUTS = {"RLSERVE_HEADER_TIMEOUT_S": "0.5", "RLSERVE_BODY_TIMEOUT_S": "0.5"}
HEAD = b"POST /predict HTTP/1.1\r\nHost: rlserve\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("slow")
    running = Server.rlserve(only(repository, tmp, "cartpole"), env=TIMEOUTS, log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def answer_of(sock: socket.socket) -> tuple[bytes, float]:
    """What the server wrote before closing, and when it closed."""
    started, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - started


def test_a_connection_that_sends_nothing_is_answered_408_and_closed(server: Server) -> None:
    with connect(server) as sock:
        data, after = answer_of(sock)
    assert data.startswith(b"HTTP/1.1 408")
    assert b'"code":"request_timeout"' in data
    assert b"header_timeout_s" in data
    assert after < 3


def test_headers_trickled_byte_by_byte_are_cut_off(server: Server) -> None:
    with connect(server) as sock:
        started = time.monotonic()
        for byte in HEAD:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break  # closed on us: what this test wants
            time.sleep(0.05)
            if time.monotonic() - started > 4:
                break
        data, _ = answer_of(sock)
    assert data.startswith(b"HTTP/1.1 408")
    assert time.monotonic() - started < 4


@pytest.mark.parametrize(
    "request_bytes",
    [
        HEAD + b"Content-Length: 1000\r\n\r\n" + b'{"observations": [',  # a lying length
        HEAD + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"obs\r\n',  # chunks that never end
    ],
    ids=["lying-content-length", "endless-chunks"],
)
def test_a_body_that_never_completes_is_answered_408(server: Server, request_bytes: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(request_bytes)
        data, after = answer_of(sock)
    assert data.startswith(b"HTTP/1.1 408")
    assert b"body_timeout_s" in data
    assert after < 3


def test_hundreds_of_slowloris_connections_are_shed_while_others_are_served(
    server: Server,
) -> None:
    idle = [connect(server) for _ in range(300)]
    for sock in idle:
        sock.sendall(HEAD)  # headers started, never finished
    with server.client() as client:
        answered = client.post("/predict", json={"observations": [0.0, 0.0, 0.0, 0.0]})
    time.sleep(2.5)
    closed = 0
    for sock in idle:
        sock.settimeout(0.5)
        with contextlib.suppress(OSError):
            closed += sock.recv(65536).startswith(b"HTTP/1.1 408")
        sock.close()
    assert answered.status_code == 200
    assert closed == len(idle)
