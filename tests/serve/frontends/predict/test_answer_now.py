"""Calls answered without a task (``RLServeApp.answer_now``, as the HTTP protocol's direct
cycle asks) against the same calls through the ASGI application, in one process: the real
application on the bundled CartPole model, no server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.serve.inprocess import serving

pytestmark = pytest.mark.anyio

GOOD = b'{"observations": [0.01, -0.02, 0.03, 0.04]}'
V2 = (
    b'{"inputs": [{"name": "observations", "shape": [1, 4], "datatype": "FP32",'
    b' "data": [0, 0, 0, 0]}]}'
)
_UNCOMPARED = {"x-request-id"}  # each path makes its own

# path, body, headers; every one is answered now (none waits for anything but its batch)
ANSWERED_NOW = {
    "good": ("/predict", GOOD, {}),
    "a version": ("/v1/models/cartpole/versions/1/predict", GOOD, {}),
    "bad JSON": ("/predict", b'{"observations": [0.1, ', {}),
    "wrong shape": ("/predict", b'{"observations": [0.1, 0.2, 0.3]}', {}),
    "unknown field": ("/predict", b'{"obs": [0, 0, 0, 0]}', {}),
    "unknown model": ("/v1/models/nope/predict", GOOD, {}),
    "bad timeout": ("/predict", GOOD, {"x-request-timeout-ms": "soon"}),
    "passed deadline": ("/predict", GOOD, {"x-request-timeout-ms": "0.001"}),
    "/v2": ("/v2/models/cartpole/infer", V2, {}),
    "/v2 bad JSON": ("/v2/models/cartpole/infer", b'{"inputs": [', {}),
    "/v2 unknown model": ("/v2/models/nope/infer", V2, {}),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Recorded:
    """A responder that keeps the answer it is given (``HttpCalls.answer_now``'s)."""

    def __init__(self) -> None:
        self.disconnected = False
        self.written = asyncio.Event()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""

    def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status, self.body = status, body
        self.headers = {k.decode(): v.decode() for k, v in headers}
        self.written.set()


def scope_of(method: str, path: str, headers: dict[str, str]) -> dict[str, Any]:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "method": method, "path": path, "headers": raw, "client": None}


@pytest.mark.parametrize("case", list(ANSWERED_NOW))
async def test_an_answer_now_is_the_asgi_answer(case: str) -> None:
    path, body, headers = ANSWERED_NOW[case]
    async with serving() as (app, client):
        by_asgi = await client.post(path, content=body, headers=headers)
        route = app.route(path)
        assert route is not None
        now = Recorded()
        assert app.answer_now(scope_of("POST", path, headers), body, now, route)
        await asyncio.wait_for(now.written.wait(), 10)
    asgi_headers = {k: v for k, v in by_asgi.headers.items() if k not in _UNCOMPARED}
    assert (now.status, now.body) == (by_asgi.status_code, by_asgi.content)
    assert {k: v for k, v in now.headers.items() if k not in _UNCOMPARED} == asgi_headers


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/predict", b""),  # 405: the task answers
        ("POST", "/predict", b"[" + b"0.0," * 100_000 + b"0.0]"),  # too large to decode here
        ("GET", "/v2/models/cartpole", b""),  # metadata: not an infer call
    ],
)
async def test_calls_that_need_their_task_are_left_to_it(
    method: str, path: str, body: bytes
) -> None:
    async with serving() as (app, _):
        route = app.route(path)
        assert route is not None
        now = Recorded()
        assert not app.answer_now(scope_of(method, path, {}), body, now, route)
    assert not now.written.is_set()
