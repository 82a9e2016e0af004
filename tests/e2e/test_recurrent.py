"""RecurrentPPO (sb3-contrib) served with client-held state: trained here on CartPole with
its velocities hidden, exported through the CLI, served by a real server. Each answer
carries the state after its step; clients send it back with their next observation, and
rows of different clients batch together."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http
from sb3_contrib import RecurrentPPO
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from serve import cli
from tests.e2e.server import Server
from tests.export.export_envs import CartPoleNoVelocity
from tests.export.export_rollouts import SourceRecurrentActor, run_episode

PREDICT = "/v1/models/recurrent/predict"


def rlserve(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    tmp = tmp_path_factory.mktemp("recurrent")
    venv = make_vec_env(CartPoleNoVelocity, n_envs=4, seed=0)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        venv,
        n_steps=128,
        batch_size=128,
        n_epochs=4,
        policy_kwargs={"lstm_hidden_size": 32, "net_arch": [32]},
        seed=0,
        device="cpu",
    )
    model.learn(4096)
    model.save(tmp / "recurrent.zip")
    feed_forward = PPO("MlpPolicy", CartPoleNoVelocity(), n_steps=64, seed=0, device="cpu")
    feed_forward.save(tmp / "feed_forward.zip")
    for name in ("recurrent", "feed_forward"):
        code, out, err = rlserve(
            "export",
            "sb3",
            tmp / f"{name}.zip",
            "--name",
            name,
            "--model-repository",
            tmp / "models",
        )
        assert code == 0, err
        assert "parity PASSED" in out
    return model, tmp / "models"


@pytest.fixture(scope="module")
def server(trained: tuple[Any, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("recurrent_server") / "log"
    running = Server.rlserve(trained[1], "--max-batch-size", "64", log=log)
    running.wait_ready()
    yield running
    running.stop()


class ServedActor:
    """One client's episode through the server: it keeps the state each answer returns."""

    def __init__(self, server: Server) -> None:
        self.client = server.client()
        self.state: list[float] | None = None

    def __call__(self, observation: np.ndarray) -> int:
        body: dict[str, Any] = {"observations": observation.tolist()}
        if self.state is None:
            body["episode_start"] = True
        else:
            body["state"] = self.state
        answer = self.client.post(PREDICT, json=body)
        assert answer.status_code == 200, answer.text
        self.state = answer.json()["state"]
        return int(answer.json()["actions"])


def test_episodes_through_the_server_replay_the_sources_predict_loop(
    trained: tuple[Any, Path], server: Server
) -> None:
    model = trained[0]
    env = CartPoleNoVelocity()
    for seed in range(3):
        theirs = run_episode(env, SourceRecurrentActor(model), seed)
        actor = ServedActor(server)
        with actor.client:
            ours = run_episode(env, actor, seed)
        assert [int(a) for a in ours.actions] == [int(a) for a in theirs.actions]


def test_concurrent_episodes_of_many_clients_each_replay_the_source(
    trained: tuple[Any, Path], server: Server
) -> None:
    """Sixteen clients step at once; their rows share batches, their states do not mix."""
    model = trained[0]

    def episode(seed: int) -> tuple[list[int], list[int]]:
        env = CartPoleNoVelocity()
        actor = ServedActor(server)
        with actor.client:
            ours = run_episode(env, actor, seed)
        theirs = run_episode(env, SourceRecurrentActor(model), seed)
        return [int(a) for a in ours.actions], [int(a) for a in theirs.actions]

    with ThreadPoolExecutor(16) as pool:
        for ours, theirs in pool.map(episode, range(100, 116)):
            assert ours == theirs


def test_a_batch_of_rows_at_different_steps_answers_each_as_alone(server: Server) -> None:
    rng = np.random.default_rng(0)
    obs = rng.uniform(-0.2, 0.2, (4, 2)).tolist()
    with server.client() as client:
        first = client.post(PREDICT, json={"observations": obs, "episode_start": True}).json()
        state = first["state"]
        starts = [False, True, False, False]
        body = {
            "observations": obs,
            "state": state,
            "episode_start": starts,
            "outputs": ["actions", "values"],
        }
        together = client.post(PREDICT, json=body).json()
        for row in range(4):
            alone = client.post(
                PREDICT,
                json={
                    "observations": obs[row],
                    "state": state[row],
                    "episode_start": starts[row],
                    "outputs": ["actions", "values"],
                },
            ).json()
            assert alone["actions"] == together["actions"][row]
            np.testing.assert_allclose(alone["values"], together["values"][row], atol=1e-6)
            np.testing.assert_allclose(alone["state"], together["state"][row], atol=1e-6)
    # the row that started again answers as the first step did
    np.testing.assert_allclose(together["state"][1], first["state"][1], atol=1e-6)


def test_sampled_steps_carry_the_same_state_as_the_mode(server: Server) -> None:
    """The LSTM reads observations, not actions: sampling changes the action only."""
    obs = [[0.01, -0.02], [0.03, 0.0]]
    with server.client() as client:
        mode = client.post(PREDICT, json={"observations": obs, "episode_start": True}).json()
        sampled = client.post(
            PREDICT,
            json={
                "observations": obs,
                "episode_start": True,
                "deterministic": False,
                "seed": 7,
                "outputs": ["actions", "log_probs"],
            },
        ).json()
    assert len(sampled["log_probs"]) == 2
    np.testing.assert_allclose(sampled["state"], mode["state"], atol=1e-6)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"observations": [0.0, 0.0]}, "state: required: this policy is recurrent"),
        ({"observations": [0.0, 0.0], "state": [0.0] * 3}, "state: shape [3]; send one row"),
        (
            {"observations": [[0.0, 0.0]] * 2, "state": [[0.0] * 128] * 2, "episode_start": [1]},
            "episode_start: expected true, false (every row) or 2 booleans",
        ),
    ],
)
def test_bad_memory_is_refused_naming_what_to_send(
    server: Server, body: dict[str, Any], message: str
) -> None:
    with server.client() as client:
        refused = client.post(PREDICT, json=body)
    assert refused.status_code == 422, refused.text
    assert message in refused.json()["error"]["message"]


def test_a_feed_forward_model_refuses_a_state(server: Server) -> None:
    with server.client() as client:
        refused = client.post(
            "/v1/models/feed_forward/predict",
            json={"observations": [0.0, 0.0], "state": [0.0] * 4},
        )
    assert refused.status_code == 422, refused.text
    assert "is not recurrent" in refused.json()["error"]["message"]


def test_v2_takes_state_and_episode_start_and_answers_the_next_state(server: Server) -> None:
    obs = np.array([[0.01, 0.02], [-0.03, 0.04]], np.float32)
    with server.client() as client:
        json_answer = client.post(
            PREDICT, json={"observations": obs.tolist(), "episode_start": True}
        ).json()
        metadata = client.get("/v2/models/recurrent").json()
    inputs = {i["name"]: (i["datatype"], i["shape"]) for i in metadata["inputs"]}
    assert inputs == {
        "obs": ("FP32", [-1, 2]),
        "state": ("FP32", [-1, 128]),
        "episode_start": ("BOOL", [-1]),
    }
    assert {"name": "state", "datatype": "FP32", "shape": [-1, 128]} in metadata["outputs"]
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.port}")
    tensors = [
        triton_http.InferInput("obs", [2, 2], "FP32"),
        triton_http.InferInput("state", [2, 128], "FP32"),
        triton_http.InferInput("episode_start", [2], "BOOL"),
    ]
    tensors[0].set_data_from_numpy(obs)
    tensors[1].set_data_from_numpy(np.zeros((2, 128), np.float32))
    tensors[2].set_data_from_numpy(np.array([True, True]))
    wanted = [triton_http.InferRequestedOutput(name) for name in ("actions", "state")]
    result = client.infer("recurrent", tensors, outputs=wanted)
    assert result.as_numpy("actions").tolist() == json_answer["actions"]
    np.testing.assert_allclose(result.as_numpy("state"), json_answer["state"], atol=1e-6)
