"""RecurrentPPO (sb3-contrib) served: trained here on CartPole with its velocities hidden,
exported through the CLI, served by a real server.

- Client-held state: each answer carries the state after its step; clients send it back
  with their next observation, and rows of different clients batch together.
- Server-held state: clients name their episode (``sequence_id``, ``sequence_start``,
  ``sequence_end``) and send observations only; each sequence keeps the version it
  started with across live updates; one given with a ``sequence_owner`` key is stepped and
  ended only with that key, and one owner's new sequences never evict another's."""

from __future__ import annotations

import contextlib
import io
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from sb3_contrib import RecurrentPPO
from stable_baselines3 import PPO

import cli
from client import LaneClient, RequestFailed
from client.policy import Memory, PolicyClient
from tests.e2e.server import Server, free_port
from tests.export.export_envs import CartPoleNoVelocity
from tests.export.export_rollouts import SourceRecurrentActor, run_episode

PREDICT = "/v1/models/recurrent/predict"
TOKEN = "recurrent-test-token"


def rlserve(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, recurrent_ppo: Path) -> tuple[Any, Path]:
    tmp = tmp_path_factory.mktemp("recurrent")
    shutil.copyfile(recurrent_ppo, tmp / "recurrent.zip")
    model = RecurrentPPO.load(recurrent_ppo, device="cpu")
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
    models = tmp / "models"
    for copy in ("swapped", "short_lived", "tenants"):  # the same policy, for tests that change it
        shutil.copytree(models / "recurrent", models / copy)
    (models / "short_lived" / "config.yaml").write_text("sequence_idle_timeout_s: 0.5\n")
    (models / "tenants" / "config.yaml").write_text(
        "max_held_sequences: 4\nmax_sequences_per_owner: 2\n"
    )
    return model, models


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def lane_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("recurrent_lane") / "lane.sock"


@pytest.fixture(scope="module")
def server(
    trained: tuple[Any, Path],
    grpc_port: int,
    lane_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("recurrent_server") / "log"
    running = Server.rlserve(
        trained[1],
        "--max-batch-size",
        "64",
        "--grpc-port",
        str(grpc_port),
        "--lane",
        str(lane_path),
        "--lane-serving",
        "thread",  # client-held state through the serving thread; sequences stay on the loop
        env={"RLSERVE_ADMIN_TOKEN": TOKEN},
        log=log,
    )
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


def test_policy_client_carries_the_state_or_names_the_sequence(
    trained: tuple[Any, Path], server: Server
) -> None:
    model = trained[0]
    env = CartPoleNoVelocity()
    theirs = run_episode(env, SourceRecurrentActor(model), 5)
    with PolicyClient(server.url) as client:
        state: Any = None

        def client_held(observation: np.ndarray) -> int:
            nonlocal state
            memory = Memory(episode_start=True) if state is None else Memory(state=state)
            answer = client.predict(observation.tolist(), model="recurrent", memory=memory)
            state = answer.state
            return int(answer.actions)

        steps = 0

        def server_held(observation: np.ndarray) -> int:
            nonlocal steps
            memory = Memory(sequence_id="policy-client", sequence_start=steps == 0)
            steps += 1
            answer = client.predict(observation.tolist(), model="recurrent", memory=memory)
            assert answer.state is None
            return int(answer.actions)

        for actor in (client_held, server_held):
            ours = run_episode(env, actor, 5)
            assert [int(a) for a in ours.actions] == [int(a) for a in theirs.actions]


def test_the_local_lane_carries_the_state_and_replays_the_source(
    trained: tuple[Any, Path], server: Server, lane_path: Path
) -> None:
    model = trained[0]
    env = CartPoleNoVelocity()
    theirs = run_episode(env, SourceRecurrentActor(model), 9)
    with LaneClient(lane_path) as lane:
        state: Any = None

        def by_lane(observation: np.ndarray) -> int:
            nonlocal state
            given = {"episode_start": True} if state is None else {"state": state}
            answer = lane.predict(observation, model="recurrent", inputs=given)
            assert answer.state is not None
            assert np.shape(answer.state) == (128,)  # one observation: no batch axis
            state = answer.state
            return int(answer.actions)

        ours = run_episode(env, by_lane, 9)
        with pytest.raises(ValueError, match="state: required by this model"):
            lane.predict(np.zeros(2, np.float32), model="recurrent")
    assert [int(a) for a in ours.actions] == [int(a) for a in theirs.actions]
    with PolicyClient(server.url, lane=lane_path) as client:  # the lane, for client-held state
        first = client.predict(
            np.zeros(2).tolist(), model="recurrent", memory=Memory(episode_start=True)
        )
        again = client.predict(
            np.zeros(2).tolist(), model="recurrent", memory=Memory(state=first.state)
        )
    with server.client() as http:
        body = {"observations": [0.0, 0.0], "episode_start": True}
        over_http = http.post(PREDICT, json=body).json()
        body = {"observations": [0.0, 0.0], "state": over_http["state"]}
        second = http.post(PREDICT, json=body).json()
    np.testing.assert_allclose(first.state, over_http["state"], atol=1e-6)
    np.testing.assert_allclose(again.state, second["state"], atol=1e-6)


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
    assert_refused(server, body, message)


def assert_refused(server: Server, body: dict[str, Any], message: str) -> None:
    """The predict call is answered 422 with ``message`` in its error."""
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


# ---------------------------------------------------------------------- server-held state


class SequenceActor:
    """One episode through the server, which holds its state: observations and the
    sequence's id only. Remembers the version stamped on every answer."""

    def __init__(self, server: Server, sequence_id: str | int, model: str = "recurrent") -> None:
        self.client = server.client()
        self.sequence_id = sequence_id
        self.path = f"/v1/models/{model}/predict"
        self.started = False
        self.versions: list[int] = []

    def __call__(self, observation: np.ndarray) -> int:
        answer = self.step(observation)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert "state" not in body  # the server holds it
        self.versions.append(body["model_version"])
        assert answer.headers["x-policy-version"] == str(body["model_version"])
        return int(body["actions"])

    def step(self, observation: np.ndarray, *, end: bool = False) -> Any:
        body = {
            "observations": observation.tolist(),
            "sequence_id": self.sequence_id,
            "sequence_start": not self.started,
            "sequence_end": end,
        }
        self.started = True
        return self.client.post(self.path, json=body)


def test_server_held_episodes_replay_the_sources_predict_loop(
    trained: tuple[Any, Path], server: Server
) -> None:
    model = trained[0]
    env = CartPoleNoVelocity()
    for seed in range(2):
        theirs = run_episode(env, SourceRecurrentActor(model), seed)
        actor = SequenceActor(server, f"episode-{seed}")
        with actor.client:
            ours = run_episode(env, actor, seed)
        assert [int(a) for a in ours.actions] == [int(a) for a in theirs.actions]


def test_sixteen_server_held_sequences_at_once_each_replay_the_source(
    trained: tuple[Any, Path], server: Server
) -> None:
    model = trained[0]

    def episode(seed: int) -> tuple[list[int], list[int]]:
        env = CartPoleNoVelocity()
        actor = SequenceActor(server, seed)
        with actor.client:
            ours = run_episode(env, actor, seed)
        theirs = run_episode(env, SourceRecurrentActor(model), seed)
        return [int(a) for a in ours.actions], [int(a) for a in theirs.actions]

    with ThreadPoolExecutor(16) as pool:
        for ours, theirs in pool.map(episode, range(200, 216)):
            assert ours == theirs


def test_the_local_lane_names_server_held_sequences_and_replays_the_source(
    trained: tuple[Any, Path], server: Server, lane_path: Path
) -> None:
    """Over the lane a row names its sequence (an integer id) and the server keeps its
    memory: no state travels; a batch steps one sequence per row, as over HTTP."""
    model = trained[0]
    env = CartPoleNoVelocity()
    theirs = run_episode(env, SourceRecurrentActor(model), 11)
    with LaneClient(lane_path) as lane:
        steps = 0

        def by_lane(observation: np.ndarray) -> int:
            nonlocal steps
            answer = lane.predict(
                observation, model="recurrent", sequence_id=7011, sequence_start=steps == 0
            )
            steps += 1
            assert answer.state is None  # the server holds it
            return int(answer.actions)

        ours = run_episode(env, by_lane, 11)
        assert [int(a) for a in ours.actions] == [int(a) for a in theirs.actions]
        rows = np.zeros((2, 2), np.float32)
        batch = lane.predict(rows, model="recurrent", sequence_id=[7101, 7102], sequence_start=True)
        assert np.shape(batch.actions) == (2,)
        with pytest.raises(RequestFailed, match="no such live sequence") as refused:
            lane.predict(rows[0], model="recurrent", sequence_id=7999)  # never started
        assert refused.value.status == 422
        with pytest.raises(ValueError, match="integer ids"):
            lane.predict(rows[0], model="recurrent", sequence_id="episode-1")
        with pytest.raises(RequestFailed, match="not a recurrent policy"):
            lane.predict(np.zeros(2, np.float32), model="feed_forward", sequence_id=1)
    with PolicyClient(server.url, lane=lane_path) as client:  # integer ids: the lane
        steps = 0

        def policy_client(observation: np.ndarray) -> int:
            nonlocal steps
            memory = Memory(sequence_id=7301, sequence_start=steps == 0)
            steps += 1
            answer = client.predict(observation, model="recurrent", memory=memory)
            assert answer.state is None
            return int(answer.actions)

        ours = run_episode(env, policy_client, 11)
    assert [int(a) for a in ours.actions] == [int(a) for a in theirs.actions]


def test_a_batch_steps_one_sequence_per_row(server: Server) -> None:
    """A vector env's rows, one sequence each, equal the same sequences stepped alone."""
    rng = np.random.default_rng(1)
    steps = rng.uniform(-0.2, 0.2, (3, 2, 2)).tolist()
    with server.client() as client:
        together = []
        for t, obs in enumerate(steps):
            body = {"observations": obs, "sequence_id": ["v0", "v1"], "sequence_start": t == 0}
            answer = client.post(PREDICT, json=body)
            assert answer.status_code == 200, answer.text
            together.append(answer.json()["actions"])
        for row in range(2):
            for t, obs in enumerate(steps):
                body = {"observations": obs[row], "sequence_id": f"alone-{row}"}
                body["sequence_start"] = t == 0
                alone = client.post(PREDICT, json=body).json()
                assert alone["actions"] == together[t][row]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"observations": [0.0, 0.0], "sequence_id": "never-started"},
            'sequence_id "never-started": no such live sequence',
        ),
        (
            {
                "observations": [0.0, 0.0],
                "sequence_id": "x",
                "sequence_start": True,
                "state": [0.0] * 128,
            },
            "state: the server holds the memory of sequence_id's sequences",
        ),
        (
            {"observations": [0.0, 0.0], "sequence_id": True, "sequence_start": True},
            "sequence_id: expected a sequence id (a string of 1 to 128 characters, or an "
            "integer >= 0)",
        ),
        (
            {"observations": [[0.0, 0.0]] * 2, "sequence_id": ["a", "a"], "sequence_start": True},
            "sequence_id: ids repeat within the request",
        ),
        (
            {"observations": [0.0, 0.0], "sequence_id": "o", "sequence_owner": 7},
            "sequence_owner: expected a key of the client's own, a string of 1 to 128",
        ),
        (
            {"observations": [0.0, 0.0], "sequence_start": True},
            "sequence_id: required with sequence_start or sequence_end",
        ),
    ],
)
def test_bad_sequence_steps_are_refused_naming_what_to_send(
    server: Server, body: dict[str, Any], message: str
) -> None:
    assert_refused(server, body, message)


def test_an_ended_sequence_is_gone_and_an_idle_one_is_evicted_saying_so(server: Server) -> None:
    with server.client() as client:
        path = "/v1/models/short_lived/predict"
        first = {"observations": [0.0, 0.0], "sequence_id": 1, "sequence_start": True}
        assert client.post(path, json=first).status_code == 200
        last = {"observations": [0.0, 0.0], "sequence_id": 1, "sequence_end": True}
        assert client.post(path, json=last).status_code == 200
        ended = client.post(path, json={"observations": [0.0, 0.0], "sequence_id": 1})
        assert ended.status_code == 422
        assert "no such live sequence" in ended.json()["error"]["message"]
        assert client.post(path, json={**first, "sequence_id": 2}).status_code == 200
        time.sleep(0.7)  # past its sequence_idle_timeout_s of 0.5
        evicted = client.post(path, json={"observations": [0.0, 0.0], "sequence_id": 2})
        assert evicted.status_code == 422
        message = evicted.json()["error"]["message"]
        assert "evicted (it was idle for more than 0.5 s)" in message
        assert "sequence_start: true" in message
        described = client.get("/v1/models/short_lived").json()["sequences"]
    assert described["evictions"] == 1
    assert described["idle_timeout_s"] == 0.5


def test_v2_and_tritonclient_step_server_held_sequences(server: Server) -> None:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server.port}")
    obs = np.array([[0.01, 0.02]], np.float32)
    actions = []
    for t in range(3):
        tensor = triton_http.InferInput("obs", [1, 2], "FP32")
        tensor.set_data_from_numpy(obs * (t + 1))
        result = client.infer(
            "recurrent",
            [tensor],
            outputs=[triton_http.InferRequestedOutput("actions")],
            sequence_id=42,
            sequence_start=t == 0,
            sequence_end=t == 2,
        )
        actions.append(int(result.as_numpy("actions")[0]))
    with server.client() as http:
        alone = []
        for t in range(3):
            body = {
                "observations": (obs[0] * (t + 1)).tolist(),
                "sequence_id": "json-42",
                "sequence_start": t == 0,
            }
            alone.append(http.post(PREDICT, json=body).json()["actions"])
    assert actions == alone


def test_grpc_steps_server_held_sequences_with_tritons_sequence_parameters(
    server: Server, grpc_port: int
) -> None:
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    obs = np.array([[0.05, -0.01]], np.float32)
    by_grpc, by_json = [], []
    with server.client() as http:
        for t in range(3):
            tensor = triton_grpc.InferInput("obs", [1, 2], "FP32")
            tensor.set_data_from_numpy(obs * (t + 1))
            result = client.infer(
                "recurrent",
                [tensor],
                outputs=[triton_grpc.InferRequestedOutput("values")],
                sequence_id=7,
                sequence_start=t == 0,
            )
            by_grpc.append(float(result.as_numpy("values")[0]))
            body = {
                "observations": (obs[0] * (t + 1)).tolist(),
                "sequence_id": "json-7",
                "sequence_start": t == 0,
                "outputs": ["values"],
            }
            by_json.append(http.post(PREDICT, json=body).json()["values"])
    np.testing.assert_allclose(by_grpc, by_json, atol=1e-6)
    assert len(set(by_grpc)) == 3  # the state moved between steps


def test_a_live_update_never_moves_a_running_sequence_to_another_version(
    trained: tuple[Any, Path], server: Server
) -> None:
    """Sequences step while versions 2 and 3 are pushed: each sequence answers from the
    version it started on to its end (version 1 stays loaded for one that outlives two
    updates), and sequences started after an update run on the new version."""
    onnx = (trained[1] / "swapped" / "1" / "model.onnx").read_bytes()
    env_seeds = iter(range(300, 10_000))
    lock = threading.Lock()
    finished: list[list[int]] = []
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            with lock:
                seed = next(env_seeds)
            actor = SequenceActor(server, f"swap-{seed}", model="swapped")
            with actor.client:
                for t in range(20):
                    actor(np.random.default_rng(seed + t).uniform(-0.2, 0.2, 2))
            with lock:
                finished.append(actor.versions)

    long_lived = SequenceActor(server, "outlives-two-updates", model="swapped")
    long_lived(np.zeros(2))
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    with PolicyClient(server.url, admin_token=TOKEN) as admin:
        time.sleep(0.3)
        admin.push("swapped", 2, onnx)
        time.sleep(0.3)
        admin.push("swapped", 3, onnx)
        time.sleep(0.3)
    stop.set()
    for thread in threads:
        thread.join()
    long_lived(np.zeros(2))
    long_lived.client.close()
    assert long_lived.versions == [1, 1]
    assert all(len(set(versions)) == 1 for versions in finished), finished
    started_on = {versions[0] for versions in finished}
    assert {1, 3} <= started_on, started_on


def test_a_sequence_with_an_owner_is_stepped_and_ended_by_its_owner_alone(
    server: Server, grpc_port: int
) -> None:
    """Another client naming the same id, with no key or another, is told no such sequence
    (as for an id never started) and starts its own; the owner's episode goes on as if
    alone, over JSON and over tritonclient's parameters alike."""
    observations = [np.array([0.03 * (t + 1), -0.02 * t], np.float32) for t in range(3)]
    owner = {"sequence_owner": "owner-a-3f9c2e7d"}

    def body(t: int, sequence_id: str, **extra: Any) -> dict[str, Any]:
        return {
            "observations": observations[t].tolist(),
            "sequence_id": sequence_id,
            "outputs": ["values"],
            **extra,
        }

    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    with server.client() as http:
        alone = [
            http.post(PREDICT, json=body(t, "owned-ref", sequence_start=t == 0)).json()["values"]
            for t in range(3)
        ]
        first = http.post(PREDICT, json=body(0, "owned", sequence_start=True, **owner))
        assert first.status_code == 200, first.text
        never = http.post(PREDICT, json=body(1, "owned-never-started"))
        for other in ({}, {"sequence_owner": "owner-b-81d0aa45"}):
            for extra in ({}, {"sequence_end": True}):
                refused = http.post(PREDICT, json=body(1, "owned", **other, **extra))
                assert refused.status_code == 422, refused.text
                assert refused.json()["error"]["message"] == never.json()["error"][
                    "message"
                ].replace("owned-never-started", "owned")
        tensor = triton_grpc.InferInput("obs", [1, 2], "FP32")
        tensor.set_data_from_numpy(observations[2][None] * 10)
        with pytest.raises(Exception, match="no such live sequence"):
            grpc.infer("recurrent", [tensor], sequence_id="owned")
        # another owner starting the same id holds a sequence of its own
        other = body(0, "owned", sequence_start=True, sequence_owner="owner-b-81d0aa45")
        other["observations"] = (observations[2] * 10).tolist()
        assert http.post(PREDICT, json=other).status_code == 200
        second = http.post(PREDICT, json=body(1, "owned", **owner))
        assert second.status_code == 200, second.text
    tensor.set_data_from_numpy(observations[2][None])
    third = grpc.infer(
        "recurrent",
        [tensor],
        outputs=[triton_grpc.InferRequestedOutput("values")],
        sequence_id="owned",
        sequence_end=True,
        parameters=owner,
    )
    owned = [first.json()["values"], second.json()["values"], float(third.as_numpy("values")[0])]
    np.testing.assert_allclose(owned, alone, atol=1e-6)


def test_one_owners_new_sequences_evict_its_own_never_anothers(server: Server) -> None:
    """Model tenants holds 4 sequences, 2 per owner: key-a's third evicts key-a's first,
    not key-b's; once key-a, key-b and key-c hold all 4, key-d is answered 429. Each owner
    is a client of its own (a 429 holds its connection back for Retry-After)."""
    path = "/v1/models/tenants/predict"
    clients = {owner: server.client() for owner in ("key-a-77f1", "key-b-5e0c", "key-c-9a3b")}

    def step(sequence_id: str, owner: str, *, start: bool = False) -> Any:
        body = {
            "observations": [0.01, 0.02],
            "sequence_id": sequence_id,
            "sequence_start": start,
            "sequence_owner": owner,
        }
        with contextlib.ExitStack() as fresh:
            client = clients.get(owner) or fresh.enter_context(server.client())
            return client.post(path, json=body)

    try:
        assert step("b1", "key-b-5e0c", start=True).status_code == 200
        for sequence_id in ("a1", "a2", "a3"):
            assert step(sequence_id, "key-a-77f1", start=True).status_code == 200
        evicted = step("a1", "key-a-77f1")
        assert evicted.status_code == 422
        assert "max_sequences_per_owner (2)" in evicted.json()["error"]["message"]
        assert step("b1", "key-b-5e0c").status_code == 200  # still live
        assert step("c1", "key-c-9a3b", start=True).status_code == 200
        full = step("d1", "key-d-02e4", start=True)
        assert full.status_code == 429, full.text
        assert "never another owner's live one" in full.json()["error"]["message"]
        for sequence_id, owner in (
            ("b1", "key-b-5e0c"),
            ("a2", "key-a-77f1"),
            ("c1", "key-c-9a3b"),
        ):
            assert step(sequence_id, owner).status_code == 200
        described = clients["key-a-77f1"].get("/v1/models/tenants").json()["sequences"]
    finally:
        for client in clients.values():
            client.close()
    assert (described["held"], described["capacity"], described["per_owner"]) == (4, 4, 2)
