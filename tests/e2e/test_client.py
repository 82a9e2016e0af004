"""The Python client against a real server: keep-alive, reconnection, threads, numpy, errors."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from client import PolicyClient, RequestFailed
from tests.e2e.server import Server

OBS = np.array([0.01, -0.02, 0.03, 0.04], dtype=np.float32)
UVICORN_KEEP_ALIVE_S = 5  # uvicorn's default for `rlserve serve`


def test_numpy_observations_go_as_they_are_and_answers_come_back(server: Server) -> None:
    with PolicyClient(server.url) as client:
        one = client.predict(OBS, outputs=("actions", "values"))
        many = client.predict(np.stack([OBS, -OBS]), model="cartpole", version=1)
    assert (one.model, one.model_version) == ("cartpole", 1)
    assert one.actions in (0, 1)
    assert isinstance(one.values, float)
    assert len(many.actions) == 2


def test_one_connection_serves_many_calls(server: Server) -> None:
    with server.client() as http, PolicyClient(server.url) as client:
        before = server.metric(http, "rlserve_requests_total", model="cartpole")
        for _ in range(50):
            client.predict(OBS)
        assert len(client._http._opened) == 1  # kept alive, not reopened
        assert server.metric(http, "rlserve_requests_total", model="cartpole") - before == 50


def test_each_thread_gets_its_own_connection(server: Server) -> None:
    with PolicyClient(server.url) as client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: client.predict(OBS).actions, range(200)))
    assert set(answers) <= {0, 1}
    assert len(answers) == 200


def test_a_connection_the_server_closed_is_reopened(server: Server) -> None:
    with PolicyClient(server.url) as client:
        client.predict(OBS)
        time.sleep(UVICORN_KEEP_ALIVE_S + 0.5)  # the server closes the idle connection
        assert client.predict(OBS).actions in (0, 1)
        assert len(client._http._opened) == 2


def test_errors_carry_status_code_and_message(server: Server) -> None:
    with PolicyClient(server.url) as client:
        with pytest.raises(RequestFailed) as bad:
            client.predict([0.0, 0.0, 0.0])
        with pytest.raises(RequestFailed) as unknown:
            client.predict(OBS, model="nope")
    assert (bad.value.status, bad.value.code) == (422, "invalid_input")
    assert "expected shape (4,)" in bad.value.message
    assert (unknown.value.status, unknown.value.code) == (404, "not_found")


def test_a_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError, match="expected http"):
        PolicyClient("localhost:8000")
