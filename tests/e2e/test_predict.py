"""POST /predict against a real server: answers, batching, exactness, stochastic actions."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort

from kernel.distributions import DiagGaussian
from kernel.spaces import Dict, input_dtype, sample
from tests.e2e.server import Server

CARTPOLE_OBS = [0.01, -0.02, 0.03, 0.04]


def test_one_observation_gets_one_action_stamped_with_its_version(server: Server) -> None:
    with server.client() as client:
        response = client.post("/predict", json={"observations": CARTPOLE_OBS})
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "cartpole"
    assert body["model_version"] == 1
    assert body["actions"] in (0, 1)
    assert response.headers["X-Policy-Version"] == "1"
    assert response.headers["X-Request-Id"]


def test_every_request_gets_what_onnxruntime_gives_for_its_own_rows(
    server: Server, repository: Path
) -> None:
    rng = np.random.default_rng(0)
    requests = [
        rng.uniform(-0.2, 0.2, (int(rng.integers(1, 4)), 4)).astype(np.float32) for _ in range(200)
    ]
    with server.client() as client:
        before = server.metric(client, "rlserve_batch_rows_count", model="cartpole")

        def ask(rows: np.ndarray) -> dict:
            body = {"observations": rows.tolist(), "outputs": ["actions", "values", "log_probs"]}
            response = client.post("/v1/models/cartpole/predict", json=body)
            assert response.status_code == 200, response.text
            return response.json()

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(ask, requests))
        batches = server.metric(client, "rlserve_batch_rows_count", model="cartpole") - before
    session = ort.InferenceSession(str(repository / "cartpole" / "1" / "model.onnx"))
    for rows, answer in zip(requests, answers, strict=True):
        action, _, value = session.run(
            ["action", "logits", "value"], {"obs": rows.astype(np.float32)}
        )
        assert answer["actions"] == action.tolist()
        # JSON carries float32 in its shortest exact form: equal as float32, bit for bit.
        np.testing.assert_array_equal(np.asarray(answer["values"], np.float32), value)
    assert batches < len(requests), "concurrent requests should have shared batches"


def test_batches_larger_than_one_show_in_the_metrics(server: Server) -> None:
    with server.client() as client, ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda _: client.post("/predict", json={"observations": CARTPOLE_OBS}), range(64)
            )
        )
        rows = server.metric(client, "rlserve_batch_rows_sum", model="cartpole")
        batches = server.metric(client, "rlserve_batch_rows_count", model="cartpole")
    assert rows / batches > 1


def test_a_seed_reproduces_stochastic_actions_and_their_log_probs(server: Server) -> None:
    body = {
        "observations": [[0.5, 0.5, 1.0], [1.0, 0.0, -2.0]],
        "deterministic": False,
        "seed": 7,
        "outputs": ["actions", "log_probs", "distribution"],
    }
    with server.client() as client:
        first = client.post("/v1/models/pendulum/predict", json=body).json()
        again = client.post("/v1/models/pendulum/predict", json=body).json()
        other = client.post("/v1/models/pendulum/predict", json={**body, "seed": 8}).json()
    assert first["actions"] == again["actions"]
    assert first["log_probs"] == again["log_probs"]
    assert first["actions"] != other["actions"]
    dist = first["distribution"]
    reference = DiagGaussian(np.array(dist["mean"]), np.array(dist["log_std"]))
    sampled = reference.sample(np.random.default_rng(7))
    np.testing.assert_allclose(first["actions"], np.clip(sampled, -2.0, 2.0), atol=1e-6)
    np.testing.assert_allclose(first["log_probs"], reference.log_prob(sampled), atol=1e-5)


def test_deterministic_box_actions_are_clipped_means(server: Server) -> None:
    body = {"observations": [0.5, 0.5, 1.0], "outputs": ["actions", "distribution"]}
    with server.client() as client:
        answer = client.post("/v1/models/pendulum/predict", json=body).json()
    np.testing.assert_allclose(
        answer["actions"], np.clip(answer["distribution"]["mean"], -2, 2), atol=1e-6
    )


def test_dict_observations_are_answered_as_onnxruntime_answers_them(
    server: Server, repository: Path
) -> None:
    with server.client() as client:
        contract = client.get("/v1/models/dict").json()["versions"][0]["contract"]
        space = Dict.model_validate(contract["observation_space"])
        rng = np.random.default_rng(3)
        rows = [
            {key: sample(leaf, rng, 1)[0].tolist() for key, leaf in space.spaces.items()}
            for _ in range(3)
        ]
        answer = client.post(
            "/v1/models/dict/predict", json={"observations": rows, "outputs": ["actions", "values"]}
        )
    assert answer.status_code == 200, answer.text
    session = ort.InferenceSession(str(repository / "dict" / "1" / "model.onnx"))
    feeds = {
        f"obs.{key}": np.asarray([r[key] for r in rows], input_dtype(leaf))
        for key, leaf in space.spaces.items()
    }
    action, value = session.run(["action", "value"], feeds)
    np.testing.assert_array_equal(np.asarray(answer.json()["actions"], np.float32), action)
    np.testing.assert_array_equal(np.asarray(answer.json()["values"], np.float32), value)


def test_a_key_given_twice_inside_dict_observations_is_refused_naming_it(server: Server) -> None:
    with server.client() as client:
        contract = client.get("/v1/models/dict").json()["versions"][0]["contract"]
        space = Dict.model_validate(contract["observation_space"])
        row = {
            key: sample(leaf, np.random.default_rng(4), 1)[0].tolist()
            for key, leaf in space.spaces.items()
        }
        key = sorted(row)[0]
        one = json.dumps(row)[:-1] + f", {json.dumps(key)}: {json.dumps(row[key])}}}"
        answers = [
            client.post("/v1/models/dict/predict", content=f'{{"observations": {body}}}',
                        headers={"Content-Type": "application/json"})
            for body in (one, f"[{json.dumps(row)}, {one}]")
        ]  # fmt: skip
    for answer, where in zip(answers, ["observations", "observations[1]"], strict=True):
        assert answer.status_code == 400, answer.text
        message = answer.json()["error"]["message"]
        assert message.startswith(f"{where}: the key(s) {json.dumps(key)} appear more than once")


def test_the_models_endpoint_shows_contract_versions_and_batching(server: Server) -> None:
    with server.client() as client:
        listing = client.get("/v1/models").json()
        model = client.get("/v1/models/pendulum").json()
    assert {m["name"] for m in listing["models"]} == {"cartpole", "pendulum", "dict"}
    assert model["active_version"] == 1
    assert model["versions"][0]["contract"]["schema"] == "rlserve.policy/v1"
    assert model["versions"][0]["contract"]["action_space"]["type"] == "Box"
    assert model["batching"]["max_batch_size"] == 32


def test_the_openapi_document_describes_the_predict_routes(server: Server) -> None:
    with server.client() as client:
        spec = client.get("/openapi.json").json()
    assert "/v1/models/{model}/versions/{version}/predict" in spec["paths"]
    assert "observations" in spec["components"]["schemas"]["PredictRequest"]["properties"]
