"""Off-policy SB3 policies (SAC, TD3, DDPG, DQN; sb3-contrib's QR-DQN, TQC): trained here,
exported through the CLI with their parity gate, served by a real server, and answering as
Stable-Baselines3 does."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_contrib import QRDQN, TQC
from stable_baselines3 import DDPG, DQN, SAC, TD3

import cli
from client import LaneClient
from kernel import contract
from tests.e2e.server import Server
from tests.export import cleanrl_agents

STEPS = 200  # 100 gradient steps (DQN's: 25); parity does not need a good policy
SETTINGS = {"learning_starts": 100, "buffer_size": 1_000, "seed": 0, "device": "cpu"}


@dataclass(frozen=True)
class OffPolicy:
    name: str
    algorithm: Any  # the SB3 class
    env_id: str
    distribution: str
    outputs: list[str]


SQUASHED = "squashed_diag_gaussian"
POLICIES = [
    OffPolicy("sac", SAC, "Pendulum-v1", SQUASHED, ["action", "mean", "log_std", "value"]),
    OffPolicy("td3", TD3, "Pendulum-v1", "deterministic", ["action", "value"]),
    OffPolicy("ddpg", DDPG, "Pendulum-v1", "deterministic", ["action", "value"]),
    OffPolicy("dqn", DQN, "CartPole-v1", "deterministic", ["action", "q_values", "value"]),
    OffPolicy("qrdqn", QRDQN, "CartPole-v1", "deterministic", ["action", "q_values", "value"]),
    OffPolicy("tqc", TQC, "Pendulum-v1", SQUASHED, ["action", "mean", "log_std", "value"]),
]  # fmt: skip
BY_NAME = {p.name: p for p in POLICIES}
AGENTS = Path(cleanrl_agents.__file__)
# CleanRL-style modules through `rlserve export torch --algorithm ...`: name, factory, env
TORCH_MODULES = [
    ("torch_dqn", "make_q_network", "CartPole-v1"),
    ("torch_td3", "make_td3_actor", "Pendulum-v1"),
    ("torch_sac", "make_sac_actor", "Pendulum-v1"),
]


@dataclass(frozen=True)
class Trained:
    policy: OffPolicy
    model: Any
    checkpoint: Path
    export_stdout: str


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def rlserve(*args: str | Path) -> Ran:
    """The CLI in this process (torch is imported already): what it exits with and prints."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return Ran(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Trained]]:
    tmp = tmp_path_factory.mktemp("off_policy")
    repo, trained = tmp / "models", {}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for policy in POLICIES:
            model = policy.algorithm("MlpPolicy", policy.env_id, **SETTINGS)
            model.learn(STEPS)
            checkpoint = tmp / f"{policy.name}.zip"
            model.save(checkpoint)
            done = rlserve(
                "export", "sb3", checkpoint, "--name", policy.name, "--model-repository", repo
            )
            assert done.returncode == 0, done.stderr
            trained[policy.name] = Trained(policy, model, checkpoint, done.stdout)
        for name, factory, env_id in TORCH_MODULES:
            done = rlserve(
                "export", "torch", f"{AGENTS}:{factory}", "--env", env_id, "--algorithm",
                name.removeprefix("torch_"), "--name", name, "--model-repository", repo,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
    finally:
        torch.set_num_threads(previous)
    return repo, trained


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("off_policy_server")  # its log, and its local lane


@pytest.fixture(scope="module")
def server(repository: tuple[Path, dict[str, Trained]], server_dir: Path) -> Iterator[Server]:
    lane = server_dir / "lane"
    serving = ("--lane-serving", "thread")  # Q-values and actions from the serving thread
    running = Server.rlserve(repository[0], "--lane", str(lane), *serving, log=server_dir / "log")
    running.wait_ready()
    yield running
    running.stop()


def observations(env_id: str, rows: int, seed: int) -> np.ndarray:
    """Observations from real episodes (random actions), as a client would send them."""
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    seen = []
    for _ in range(rows):
        seen.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    return np.asarray(seen, dtype=np.float32)


def predict(server: Server, name: str, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as client:
        answer = client.post(f"/v1/models/{name}/predict", json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


@pytest.mark.parametrize("name", list(BY_NAME))
def test_each_algorithm_exports_with_its_parity_gate_and_contract(
    repository: tuple[Path, dict[str, Trained]], name: str
) -> None:
    trained = repository[1][name]
    assert "parity PASSED" in trained.export_stdout
    policy = contract.read(repository[0] / name / "1" / "model.onnx")
    assert policy.algorithm.value == name  # DDPG told apart from TD3 by its settings
    assert policy.distribution.kind.value == trained.policy.distribution
    assert [o.name for o in policy.outputs] == trained.policy.outputs
    assert not policy.preprocessing.action_clip


@pytest.mark.parametrize("name", list(BY_NAME))
def test_served_actions_and_values_are_the_source_policy_s(
    repository: tuple[Path, dict[str, Trained]], server: Server, name: str
) -> None:
    trained = repository[1][name]
    obs = observations(trained.policy.env_id, 64, seed=3)
    answer = predict(server, name, {"observations": obs.tolist(), "outputs": ["actions", "values"]})
    expected, _ = trained.model.predict(obs, deterministic=True)
    served = np.asarray(answer["actions"])
    if name in ("dqn", "qrdqn"):
        np.testing.assert_array_equal(served, expected)
    else:
        np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(answer["values"], value_of(trained, obs), rtol=1e-4, atol=1e-4)


def value_of(trained: Trained, obs: np.ndarray) -> np.ndarray:
    """The source's value: the critics' of the deterministic action, or the largest Q."""
    policy, name = trained.model.policy, trained.policy.name
    with torch.no_grad():
        tensor = torch.as_tensor(obs)
        if name == "dqn":
            value = policy.q_net(tensor).max(dim=1).values
        elif name == "qrdqn":
            value = policy.quantile_net(tensor).mean(dim=1).max(dim=1).values
        elif name == "tqc":
            value = policy.critic(tensor, policy.actor(tensor, deterministic=True)).mean(dim=(1, 2))
        else:
            sac = name == "sac"
            scaled = policy.actor(tensor, deterministic=True) if sac else policy.actor(tensor)
            value = torch.cat(policy.critic(tensor, scaled), dim=1).min(dim=1).values
    result: np.ndarray = value.numpy()
    return result


@pytest.mark.parametrize("name", ["td3", "dqn", "qrdqn"])
def test_a_whole_episode_through_the_server_replays_the_source_s(
    repository: tuple[Path, dict[str, Trained]], server: Server, name: str
) -> None:
    trained = repository[1][name]
    served_env, source_env = gym.make(trained.policy.env_id), gym.make(trained.policy.env_id)
    obs_served, _ = served_env.reset(seed=11)
    obs_source, _ = source_env.reset(seed=11)
    for _ in range(60):
        action = predict(server, name, {"observations": obs_served.tolist()})["actions"]
        expected, _ = trained.model.predict(obs_source, deterministic=True)
        np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-5)
        obs_served, _, done, cut, _ = served_env.step(np.asarray(action, dtype=expected.dtype))
        obs_source, _, done_too, _, _ = source_env.step(expected)
        np.testing.assert_allclose(obs_served, obs_source, rtol=1e-5, atol=1e-5)
        if done or cut:
            assert done_too
            break


@pytest.mark.parametrize("name", ["sac", "tqc"])
def test_squashed_samples_are_seeded_inside_the_bounds_and_scored_as_sb3_scores_them(
    repository: tuple[Path, dict[str, Trained]], server: Server, name: str
) -> None:
    model = repository[1][name].model
    obs = observations("Pendulum-v1", 32, seed=5)
    body = {
        "observations": obs.tolist(),
        "deterministic": False,
        "seed": 7,
        "outputs": ["actions", "log_probs", "distribution"],
    }
    first, again = predict(server, name, body), predict(server, name, body)
    assert first["actions"] == again["actions"]  # a seed gives the same actions
    other = predict(server, name, {**body, "seed": 8})
    assert other["actions"] != first["actions"]
    actions = np.asarray(first["actions"], dtype=np.float64)
    assert np.all(np.abs(actions) <= 2.0)  # Pendulum's torque bounds, never clipped past
    actor = model.policy.actor
    with torch.no_grad():
        mean, log_std, _ = actor.get_action_dist_params(torch.as_tensor(obs))
        distribution = actor.action_dist.proba_distribution(mean.double(), log_std.double())
        scaled = torch.as_tensor(actions / 2.0)  # Pendulum: [-2, 2] -> [-1, 1]
        expected = distribution.log_prob(scaled).numpy()
    np.testing.assert_allclose(first["distribution"]["mean"], mean.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first["log_probs"], expected, rtol=1e-4, atol=1e-4)
    # Given actions are scored the same way: the log-prob of what the caller took.
    scored = predict(
        server,
        name,
        {"observations": obs.tolist(), "actions": first["actions"], "outputs": ["log_probs"]},
    )
    np.testing.assert_allclose(scored["log_probs"], expected, rtol=1e-4, atol=1e-4)


def test_dqn_answers_its_q_values_on_the_json_routes_and_on_v2(
    repository: tuple[Path, dict[str, Trained]], server: Server
) -> None:
    model = repository[1]["dqn"].model
    obs = observations("CartPole-v1", 16, seed=9)
    answer = predict(server, "dqn", {"observations": obs.tolist(), "outputs": ["q_values"]})
    with torch.no_grad():
        q_values = model.policy.q_net(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(answer["q_values"], q_values, rtol=1e-5, atol=1e-5)
    with server.client() as client:
        metadata = client.get("/v2/models/dqn").json()
        tensor = {"name": "obs", "datatype": "FP32", "shape": list(obs.shape)}
        body = {
            "inputs": [{**tensor, "data": obs.ravel().tolist()}],
            "outputs": [{"name": "q_values"}],
        }
        inferred = client.post("/v2/models/dqn/infer", json=body).json()
    assert [o["name"] for o in metadata["outputs"]] == ["actions", "values", "q_values"]
    (output,) = inferred["outputs"]
    assert output["name"] == "q_values"
    assert output["shape"] == [16, 2]
    np.testing.assert_allclose(np.reshape(output["data"], (16, 2)), q_values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "parameters", "asked"),
    [
        ("td3", {"deterministic": False}, "deterministic: false"),
        ("ddpg", {"deterministic": False, "seed": 1}, "deterministic: false"),
        ("dqn", {"outputs": ["actions", "log_probs"]}, "log_probs"),
        ("qrdqn", {"deterministic": False}, "deterministic: false"),
    ],
)
def test_a_deterministic_policy_refuses_sampling_and_log_probs_saying_what_is_valid(
    server: Server, name: str, parameters: dict[str, Any], asked: str
) -> None:
    obs = observations(BY_NAME[name].env_id, 2, seed=1).tolist()
    with server.client() as client:
        refused = client.post(
            f"/v1/models/{name}/predict", json={"observations": obs, **parameters}
        )
        fine = client.post(f"/v1/models/{name}/predict", json={"observations": obs})
    assert refused.status_code == 422, refused.text
    message = refused.json()["error"]["message"]
    assert message.startswith(f"{asked}: model {name!r} is a deterministic {name.upper()} policy")
    assert "send deterministic: true" in message
    assert fine.status_code == 200  # the bad request cost the good one nothing


def test_a_forced_algorithm_must_be_one_the_policy_class_trains(
    repository: tuple[Path, dict[str, Trained]], tmp_path: Path
) -> None:
    checkpoint = repository[1]["sac"].checkpoint
    done = rlserve(
        "export",
        "sb3",
        checkpoint,
        "--algorithm",
        "ppo",
        "--name",
        "x",
        "--model-repository",
        tmp_path,
    )
    assert done.returncode == 2
    assert "--algorithm ppo: the checkpoint holds a SAC policy (SACPolicy)" in done.stderr
    assert "give --algorithm sac" in done.stderr
    assert not (tmp_path / "x").exists()


def test_cleanrl_style_off_policy_modules_export_and_serve_what_their_forward_says(
    repository: tuple[Path, dict[str, Trained]], server: Server
) -> None:
    pendulum, cartpole = observations("Pendulum-v1", 32, seed=7), observations("CartPole-v1", 32, 7)
    with torch.no_grad():
        q_values = cleanrl_agents.make_q_network()(torch.as_tensor(cartpole)).numpy()
        td3 = cleanrl_agents.make_td3_actor()(torch.as_tensor(pendulum)).numpy()
        mean, _ = cleanrl_agents.make_sac_actor()(torch.as_tensor(pendulum))
    wanted = {"outputs": ["actions", "values", "q_values"]}
    dqn = predict(server, "torch_dqn", {"observations": cartpole.tolist(), **wanted})
    np.testing.assert_array_equal(dqn["actions"], q_values.argmax(axis=1))
    np.testing.assert_allclose(dqn["q_values"], q_values, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dqn["values"], q_values.max(axis=1), rtol=1e-5, atol=1e-5)
    actor = predict(server, "torch_td3", {"observations": pendulum.tolist(), **wanted})
    np.testing.assert_allclose(actor["actions"], td3, rtol=1e-5, atol=1e-5)
    assert "values" not in actor  # an actor exported without its critic has none
    greedy = predict(server, "torch_sac", {"observations": pendulum.tolist()})
    np.testing.assert_allclose(greedy["actions"], 2.0 * np.tanh(mean.numpy()), rtol=1e-5, atol=1e-5)
    body = {"observations": pendulum.tolist(), "deterministic": False, "seed": 1}
    sampled = predict(server, "torch_sac", body)
    assert sampled == predict(server, "torch_sac", body)
    assert np.all(np.abs(np.asarray(sampled["actions"])) <= 2.0)
    policy = contract.read(repository[0] / "torch_sac" / "1" / "model.onnx")
    assert (policy.algorithm.value, policy.distribution.kind.value) == ("sac", SQUASHED)


def test_the_local_lane_answers_q_values_and_squashed_samples_as_http_does(
    server: Server, server_dir: Path
) -> None:
    with LaneClient(server_dir / "lane") as lane:
        cartpole, pendulum = (
            observations("CartPole-v1", 4, seed=8),
            observations("Pendulum-v1", 4, 8),
        )
        wanted = ("actions", "q_values", "values")
        over_lane = lane.predict(cartpole, model="dqn", outputs=wanted)
        over_http = predict(
            server, "dqn", {"observations": cartpole.tolist(), "outputs": list(wanted)}
        )
        np.testing.assert_array_equal(over_lane.actions, over_http["actions"])
        np.testing.assert_allclose(over_lane.q_values, over_http["q_values"], rtol=1e-6)
        body = {"deterministic": False, "seed": 2, "outputs": ["actions", "log_probs"]}
        sampled = lane.predict(
            pendulum, model="sac", deterministic=False, seed=2, outputs=("actions", "log_probs")
        )
        expected = predict(server, "sac", {"observations": pendulum.tolist(), **body})
        np.testing.assert_allclose(sampled.actions, expected["actions"], rtol=1e-6)
        np.testing.assert_allclose(sampled.log_probs, expected["log_probs"], rtol=1e-5)
