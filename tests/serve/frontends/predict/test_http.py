"""The predict request path in one process, without a server: the real application (the
bundled CartPole model on onnxruntime) called through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.serve.inprocess import REPOSITORY, serving

pytestmark = pytest.mark.anyio

MODEL = REPOSITORY / "cartpole" / "1" / "model.onnx"
OBS = [0.01, -0.02, 0.03, 0.04]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def onnxruntime_actions(observations: list[list[float]]) -> list[int]:
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    (actions,) = session.run(["action"], {"obs": np.asarray(observations, np.float32)})
    return [int(a) for a in actions]


def error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()["error"]
    assert body["code"] == code
    return str(body["message"])


async def test_an_answer_is_stamped_and_carries_the_callers_request_id() -> None:
    async with serving() as (_, client):
        response = await client.post(
            "/predict", json={"observations": OBS}, headers={"X-Request-Id": "abc-1"}
        )
    assert response.status_code == 200
    body = response.json()
    assert (body["model"], body["model_version"]) == ("cartpole", 1)
    assert body["actions"] == onnxruntime_actions([OBS])[0]
    assert response.headers["X-Policy-Version"] == "1"
    assert response.headers["X-Policy-SHA256"] == body["model_sha256"]
    assert response.headers["X-Request-Id"] == "abc-1"
    assert "server" not in response.headers


async def test_one_observation_answers_without_a_batch_axis_and_a_list_with_one() -> None:
    rows = [OBS, [0.1, 0.2, -0.1, -0.3]]
    async with serving() as (_, client):
        single = await client.post("/v1/models/cartpole/predict", json={"observations": OBS})
        listed = await client.post(
            "/v1/models/cartpole/versions/1/predict",
            json={"observations": rows, "outputs": ["actions", "values", "log_probs"]},
        )
    assert isinstance(single.json()["actions"], int)
    answer = listed.json()
    assert answer["actions"] == onnxruntime_actions(rows)
    assert len(answer["values"]) == len(answer["log_probs"]) == 2


async def test_fast_and_general_decoding_give_the_same_answers() -> None:
    async with serving() as (_, client):
        fast = await client.post("/predict", json={"observations": OBS, "outputs": ["values"]})
        scored = await client.post(
            "/predict",
            json={"observations": OBS, "actions": 1, "outputs": ["values"]},
        )  # "actions" takes the general path
    assert fast.json()["values"] == scored.json()["values"]


@pytest.mark.parametrize(
    ("body", "status", "code", "words"),
    [
        (b'{"observations": [0.1, ', 400, "malformed_request", "not valid JSON"),
        (b'{"obs": [0, 0, 0, 0]}', 422, "invalid_input", "unknown field(s) ['obs']"),
        (b'{"seed": 1}', 422, "invalid_input", "observations: required"),
        (b'{"observations": [0, 0, 1e39, 0]}', 422, "invalid_input", "does not fit in float32"),
        (
            b'{"observations": [[0, 0, 0, 0]], "actions": [0, 1]}',
            422,
            "invalid_input",
            "one action",
        ),
    ],
)
async def test_bad_bodies_get_errors_that_name_the_problem(
    body: bytes, status: int, code: str, words: str
) -> None:
    async with serving() as (_, client):
        message = error(await client.post("/predict", content=body), status, code)
    assert words in message


async def test_routes_methods_headers_and_sizes_are_checked_before_the_body() -> None:
    async with serving(max_body_bytes=1000) as (_, client):
        unknown = await client.post("/v1/models/nope/predict", json={"observations": OBS})
        version = await client.post("/v1/models/cartpole/versions/x/predict", json={})
        method = await client.get("/predict")
        timeout = await client.post(
            "/predict", json={"observations": OBS}, headers={"X-Request-Timeout-Ms": "-1"}
        )
        large = await client.post("/predict", content=b"[" + b"0," * 1000 + b"0]")
    assert "'nope'" in error(unknown, 404, "not_found")
    assert "ASCII digits only" in error(version, 404, "not_found")
    assert "POST only" in error(method, 405, "method_not_allowed")
    assert "X-Request-Timeout-Ms" in error(timeout, 400, "malformed_request")
    assert "max_body_bytes" in error(large, 413, "payload_too_large")


async def test_a_full_queue_answers_429_with_retry_after() -> None:
    async with serving(max_queue_rows=2) as (app, client):
        scheduler = app.state.manager.models["cartpole"].scheduler
        scheduler.hold()
        held = [asyncio.create_task(client.post("/predict", json={"observations": [OBS, OBS]}))]
        await asyncio.sleep(0.05)
        refused = await client.post("/predict", json={"observations": OBS})
        scheduler.resume()
        assert (await held[0]).status_code == 200
    assert "queue full" in error(refused, 429, "queue_full")
    assert int(refused.headers["Retry-After"]) >= 1


async def test_a_deadline_that_passes_in_the_queue_answers_504() -> None:
    async with serving() as (app, client):
        app.state.manager.models["cartpole"].scheduler.hold()
        response = await client.post(
            "/predict", json={"observations": OBS}, headers={"X-Request-Timeout-Ms": "20"}
        )
        app.state.manager.models["cartpole"].scheduler.resume()
    assert "not run" in error(response, 504, "deadline_exceeded")


async def test_while_draining_answers_ask_the_client_to_reconnect_elsewhere() -> None:
    async with serving() as (app, client):
        app.state.phases.begin_drain()
        response = await client.post("/predict", json={"observations": OBS})
        control = await client.get("/health")
    assert response.status_code == 200
    assert response.headers["Connection"] == "close"
    assert control.headers["Connection"] == "close"


async def test_metrics_label_only_served_models() -> None:
    async with serving() as (_, client):
        await client.post("/predict", json={"observations": OBS})
        for name in ("a", "b", "c"):
            await client.post(f"/v1/models/{name}/predict", json={"observations": OBS})
        await client.post("/predict", json={"observations": [9, 9, 9]})
        text = (await client.get("/metrics")).text
    assert 'rlserve_requests_total{model="cartpole",status="200",version="1"} 1.0' in text
    assert 'rlserve_requests_total{model="",status="404",version=""} 3.0' in text
    assert 'rlserve_requests_total{model="cartpole",status="422",version="1"} 1.0' in text
    assert 'model="a"' not in text


async def test_each_exchange_gets_one_access_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rlserve.access")
    async with serving(access_log=True) as (_, client):
        await client.post("/predict", json={"observations": OBS}, headers={"X-Request-Id": "q"})
    lines = [r.getMessage() for r in caplog.records if r.name == "rlserve.access"]
    assert len(lines) == 1
    assert '"request_id":"q"' in lines[0]
    assert '"status":200' in lines[0]


async def test_a_vector_of_64_envs_is_split_across_batches_and_answered_as_if_whole() -> None:
    rows = np.random.default_rng(5).uniform(-0.2, 0.2, (64, 4)).round(4).tolist()
    body = {
        "observations": rows,
        "deterministic": False,
        "seed": 11,
        "outputs": ["actions", "log_probs"],
    }
    async with serving(max_batch_size=64) as (_, client):
        whole = (await client.post("/predict", json=body)).json()
    async with serving(max_batch_size=8) as (app, client):
        split = await client.post("/predict", json=body)
        batches = app.state.manager.lifecycle("cartpole").scheduler.describe()
    assert split.status_code == 200, split.text
    answer = split.json()
    assert answer["actions"] == whole["actions"]  # the same seeded draw, part by part
    assert answer["log_probs"] == pytest.approx(whole["log_probs"], abs=1e-6)
    assert len(answer["actions"]) == 64
    assert batches["max_batch_size"] == 8


async def test_a_call_the_model_would_refuse_is_answered_from_its_headers() -> None:
    async with serving(max_queue_rows=1) as (app, client):
        scheduler = app.state.manager.lifecycle("cartpole").scheduler
        headers = [(b"content-type", b"application/json"), (b"x-request-id", b"early-1")]
        refuse = app.transports.predict.refuse_early
        idle = refuse(b"POST", b"/predict", headers, time.monotonic())
        scheduler.hold()
        queued = asyncio.create_task(client.post("/predict", json={"observations": OBS}))
        await asyncio.sleep(0.05)
        not_yet = refuse(b"POST", b"/predict", headers, time.monotonic())  # nothing refused
        first = await client.post("/predict", json={"observations": OBS})  # refused in full
        refused = refuse(b"POST", b"/v1/models/cartpole/predict?x=1", headers, time.monotonic())
        other_route = refuse(b"POST", b"/v1/models", headers, time.monotonic())
        # sent while its connection was left unread after a refusal, 2 s ago: past its 1 s
        late = refuse(b"POST", b"/predict", headers, time.monotonic() - 2.0)
        waited = refuse(b"POST", b"/predict", headers, time.monotonic() - 0.1)
        scheduler.resume()
        assert (await queued).status_code == 200
    assert idle is None
    assert not_yet is None  # until a call was refused, calls go their usual way
    assert first.status_code == 429
    assert other_route is None
    assert refused is not None
    assert refused.read_again_after_s >= 1.0  # the connection waits out its Retry-After
    head, body = refused.answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert b"\r\nretry-after: " in head
    assert b"\r\nx-request-id: early-1" in head
    assert f"content-length: {len(body)}".encode() in head
    assert b'"code":"queue_full"' in body
    assert waited is not None  # within its deadline, and its model would still refuse it
    assert waited.answer.startswith(b"HTTP/1.1 429 ")
    assert late is not None
    head, body = late.answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 504 Gateway Timeout\r\n")
    assert f"content-length: {len(body)}".encode() in head
    assert b'"code":"deadline_exceeded"' in body
    assert b"passed before it was read" in body


async def test_refusals_quote_the_clients_values_as_json() -> None:
    bodies = [
        ({"observations": OBS, "seed": True}, "seed: expected a non-negative integer, got true"),
        ({"observations": OBS, "deterministic": 0}, "deterministic: expected true or false, got 0"),
        ({"observations": ["a", 0, 0, 0]}, 'expected numbers, got "a"'),
    ]
    async with serving() as (_, client):
        answers = [await client.post("/predict", json=body) for body, _ in bodies]
    for answer, (_, words) in zip(answers, bodies, strict=True):
        assert answer.status_code == 422, answer.text
        assert words in answer.json()["error"]["message"]
