"""The observation bounds policy over HTTP, against a real server: one model per mode (the
server default, allow, and two that override it in their config.yaml), and the counter of
rows outside the bounds on /metrics."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import DEMO, only
from tests.e2e.server import Server

# CartPole's bounds, as its contract stores them: x within ±4.8, the angle within ±0.4189.
X, ANGLE = 4.800000190734863, 0.41887903213500977
OUTSIDE = [5.0, 0.0, 3.0, 0.0]  # both bounded dimensions out
CLIPPED = [X, 0.0, ANGLE, 0.0]
OUTPUTS = ["actions", "values", "log_probs"]


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """cartpole as the server default (allow), clipped and strict overriding it; pendulum
    (Box actions) strict as well."""
    tmp = tmp_path_factory.mktemp("bounds")
    repo = tmp / "repository"
    for name, mode in (("cartpole", None), ("clipped", "clip"), ("strict", "reject")):
        shutil.copytree(DEMO, repo / name)
        if mode is not None:
            (repo / name / "config.yaml").write_text(f"observation_bounds: {mode}\n")
    shutil.copytree(repository / "pendulum", repo / "pendulum")
    (repo / "pendulum" / "config.yaml").write_text("observation_bounds: reject\n")
    running = Server.rlserve(repo, "--default-model", "cartpole", log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()


def predict(client: httpx.Client, model: str, observations: Any, **more: Any) -> httpx.Response:
    body = {"observations": observations, "outputs": OUTPUTS, **more}
    return client.post(f"/v1/models/{model}/predict", json=body)


def answer(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body = response.json()
    return {k: body[k] for k in OUTPUTS}


def out_of_bounds(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    found = re.findall(
        r'^rlserve_observations_out_of_bounds_total\{model="(\w*)"\} (\S+)$', text, re.M
    )
    return {model: float(value) for model, value in found}


def test_allow_is_the_default_and_serves_the_observation_as_given(server: Server) -> None:
    with server.client() as client:
        given = answer(predict(client, "cartpole", OUTSIDE))
        clipped = answer(predict(client, "cartpole", CLIPPED))
        default_route = client.post("/predict", json={"observations": OUTSIDE})
    assert given["values"] != clipped["values"]  # the model saw 5.0 and 3.0
    assert default_route.status_code == 200


def test_clip_answers_what_the_clipped_observation_gets(server: Server) -> None:
    with server.client() as client:
        clipped = answer(predict(client, "clipped", [OUTSIDE, [-9.0, 1.0, -0.5, 2.0]]))
        reference = answer(predict(client, "cartpole", [CLIPPED, [-X, 1.0, -ANGLE, 2.0]]))
        single = answer(predict(client, "clipped", OUTSIDE))  # the fast path of one row
    assert clipped == reference
    assert single == {k: v[0] for k, v in reference.items()}


def test_reject_refuses_with_422_naming_the_value_and_the_bounds(server: Server) -> None:
    with server.client() as client:
        refused = predict(client, "strict", [[0.0] * 4, OUTSIDE])
        fine = predict(client, "strict", CLIPPED)  # on the bounds is within them
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["message"] == (
        "observations: value 5.0 at index [1, 0] is outside the space's bounds [-4.8, 4.8]"
    )
    assert fine.status_code == 200


def test_rows_outside_the_bounds_are_counted_per_model_in_every_mode(server: Server) -> None:
    rows = [OUTSIDE, [0.0] * 4, [0.0, 0.0, -0.5, 0.0]]  # two of three outside
    with server.client() as client:
        before = out_of_bounds(client)
        for model in ("cartpole", "clipped", "strict"):
            predict(client, model, rows)
            predict(client, model, [0.0] * 4)  # in bounds: not counted
        after = out_of_bounds(client)
    for model in ("cartpole", "clipped", "strict"):
        assert after[model] - before.get(model, 0.0) == 2, (model, before, after)
    assert set(after) <= {"cartpole", "clipped", "strict", "pendulum"}  # served models only


def test_actions_outside_their_box_are_refused_but_not_counted_as_observations(
    server: Server,
) -> None:
    with server.client() as client:
        before = out_of_bounds(client).get("pendulum", 0.0)
        refused = predict(client, "pendulum", [1.0, 0.0, 0.5], actions=[3.0])
        after = out_of_bounds(client).get("pendulum", 0.0)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["message"].startswith("actions: value 3.0 at index [0, 0]")
    assert after == before


def test_booleans_in_observations_or_actions_are_refused_and_parameters_keep_theirs(
    server: Server,
) -> None:
    with server.client() as client:
        observation = client.post(
            "/predict", json={"observations": [[0.0] * 4, [0.0, True, 0.0, 0.0]]}
        )
        action = predict(client, "cartpole", [0.0] * 4, actions=False)
        parameter = client.post("/predict", json={"observations": [0.0] * 4, "deterministic": True})
    for refused, where in ((observation, "observations[1][1]: true"), (action, "actions: false")):
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"] == {
            "code": "invalid_input",
            "message": f"{where} is a boolean; expected a number (1 for true, 0 for false)",
        }
    assert parameter.status_code == 200


def test_the_server_wide_default_comes_from_a_flag_too(repository: Path, tmp_path: Path) -> None:
    server = Server.rlserve(
        only(repository, tmp_path, "cartpole"),
        "--observation-bounds",
        "reject",
        log=tmp_path / "log",
    )
    try:
        server.wait_ready()
        with server.client() as client:
            refused = predict(client, "cartpole", OUTSIDE)
    finally:
        server.stop()
    assert refused.status_code == 422
    assert "outside the space's bounds" in refused.json()["error"]["message"]


def test_each_model_says_its_bounds_policy(server: Server) -> None:
    with server.client() as client:
        policies = {
            name: client.get(f"/v1/models/{name}").json()["observation_bounds"]
            for name in ("cartpole", "clipped", "strict")
        }
    assert policies == {"cartpole": "allow", "clipped": "clip", "strict": "reject"}
