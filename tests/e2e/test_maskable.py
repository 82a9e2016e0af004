"""MaskablePPO (sb3-contrib): trained here under action masks, exported through the CLI with
its parity gate, served by a real server; masks are validated like observations, and a
masked action is never returned, greedy or sampled."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
from gymnasium import spaces
from sb3_contrib import MaskablePPO

import cli
from client import LaneClient, PolicyClient, RequestFailed
from kernel import contract
from tests.e2e.server import Server, free_port

ACTIONS = 5


class MaskedChoice(gym.Env[np.ndarray, int]):
    """Four numbers in, five actions; the odd ones are illegal whenever obs[0] > 0."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = spaces.Discrete(ACTIONS)  # type: ignore[assignment]
        self._rng = np.random.default_rng(0)
        self._obs = np.zeros(4, np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, Any]:
        super().reset(seed=seed)
        self._obs, self._t = self._draw(), 0
        return self._obs, {}

    def action_masks(self) -> np.ndarray:
        legal = np.ones(ACTIONS, bool)
        if self._obs[0] > 0:
            legal[1::2] = False
        return legal

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, Any]:
        reward = 1.0 if self.action_masks()[action] else -1.0
        self._obs, self._t = self._draw(), self._t + 1
        return self._obs, reward, self._t >= 20, False, {}

    def _draw(self) -> np.ndarray:
        return self._rng.uniform(-1, 1, 4).astype(np.float32)


def rlserve(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, str]:
    tmp = tmp_path_factory.mktemp("maskable")
    model = MaskablePPO(
        "MlpPolicy", MaskedChoice(), n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu"
    )
    model.learn(128)
    model.save(tmp / "masked.zip")
    code, out, err = rlserve(
        "export",
        "sb3",
        tmp / "masked.zip",
        "--name",
        "masked",
        "--model-repository",
        tmp / "models",
    )
    assert code == 0, err
    return model, tmp / "models", out


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(
    trained: tuple[Any, Path, str], grpc_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("maskable_server") / "log"
    lane = log.parent / "lane.sock"
    running = Server.rlserve(
        trained[1],
        "--grpc-port",
        str(grpc_port),
        "--lane",
        str(lane),
        "--lane-serving",
        "thread",
        log=log,  # the lane's serving thread takes masks too
    )
    running.wait_ready()
    yield running
    running.stop()


def batch(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Observations and random masks with at least one legal action each."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (rows, 4)).astype(np.float32)
    masks = rng.random((rows, ACTIONS)) < 0.4
    masks[np.arange(rows), rng.integers(0, ACTIONS, rows)] = True
    return obs, masks


def predict(server: Server, body: dict[str, Any]) -> Any:
    with server.client() as client:
        return client.post("/v1/models/masked/predict", json=body)


def test_the_export_declares_the_mask_and_its_golden_vectors_carry_masks(
    trained: tuple[Any, Path, str],
) -> None:
    _, repository, out = trained
    assert "parity PASSED" in out
    path = repository / "masked" / "1" / "model.onnx"
    policy = contract.read(path)
    assert policy.algorithm.value == "maskable_ppo"
    mask = policy.action_mask
    assert mask is not None
    assert (mask.name, mask.dtype, mask.shape) == ("action_mask", "bool", ["batch", ACTIONS])
    assert all(len(g.action_masks) == 1 for g in policy.golden)
    code, verified, err = rlserve("verify", path)
    assert code == 0, err + verified


def test_served_actions_are_the_source_s_under_the_same_masks(
    trained: tuple[Any, Path, str], server: Server
) -> None:
    model = trained[0]
    obs, masks = batch(64, seed=1)
    answer = predict(server, {"observations": obs.tolist(), "action_masks": masks.tolist()})
    assert answer.status_code == 200, answer.text
    expected, _ = model.predict(obs, deterministic=True, action_masks=masks)
    np.testing.assert_array_equal(answer.json()["actions"], expected)
    assert masks[np.arange(64), expected].all()


def test_sampled_actions_are_never_masked_and_score_as_the_source_scores_them(
    trained: tuple[Any, Path, str], server: Server
) -> None:
    model = trained[0]
    obs, masks = batch(512, seed=2)
    body = {
        "observations": obs.tolist(),
        "action_masks": masks.astype(int).tolist(),  # 0 and 1 stand for false and true
        "deterministic": False,
        "seed": 3,
        "outputs": ["actions", "log_probs"],
    }
    answer = predict(server, body)
    assert answer.status_code == 200, answer.text
    actions = np.asarray(answer.json()["actions"])
    assert masks[np.arange(512), actions].all()
    assert len(set(actions.tolist())) > 1  # sampled, not the mode
    policy = model.policy
    with torch.no_grad():
        tensor = torch.as_tensor(obs)
        _, log_prob, _ = policy.evaluate_actions(
            tensor, torch.as_tensor(actions), action_masks=masks
        )
    np.testing.assert_allclose(answer.json()["log_probs"], log_prob.numpy(), rtol=1e-5, atol=1e-5)


PER_OBSERVATION = "give one mask of 5 booleans per observation (2 masks)"
BAD_MASKS = [
    (None, f"action_masks: required: this policy acts under an action mask; {PER_OBSERVATION}"),
    ([[True] * 5, [False] * 5], "action_masks[1]: no legal action; every mask needs at least one"),
    ([[True] * 4, [True] * 4], f"action_masks: shape [2, 4]; {PER_OBSERVATION}"),
    ([[1, 0, 2, 0, 0], [1] * 5], "action_masks: expected booleans (or 0 and 1)"),
]


@pytest.mark.parametrize(("masks", "message"), BAD_MASKS)
def test_a_bad_mask_is_refused_saying_what_a_mask_is_and_costs_nothing_else(
    server: Server, masks: Any, message: str
) -> None:
    obs, good = batch(2, seed=4)
    body: dict[str, Any] = {"observations": obs.tolist()}
    if masks is not None:
        body["action_masks"] = masks
    refused = predict(server, body)
    fine = predict(server, {**body, "action_masks": good.tolist()})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["message"].startswith(message)
    assert fine.status_code == 200


def test_v2_takes_the_mask_as_a_bool_tensor(trained: tuple[Any, Path, str], server: Server) -> None:
    model = trained[0]
    obs, masks = batch(8, seed=5)
    mask = {"name": "action_mask", "datatype": "BOOL", "shape": [8, ACTIONS]}
    observed = {"name": "obs", "datatype": "FP32", "shape": [8, 4], "data": obs.ravel().tolist()}
    body = {
        "inputs": [observed, {**mask, "data": masks.ravel().tolist()}],
        "outputs": [{"name": "actions"}],
    }
    with server.client() as client:
        metadata = client.get("/v2/models/masked").json()
        answer = client.post("/v2/models/masked/infer", json=body)
        missing = client.post("/v2/models/masked/infer", json={**body, "inputs": [observed]})
    assert {"name": "action_mask", "datatype": "BOOL", "shape": [-1, ACTIONS]} in metadata["inputs"]
    assert answer.status_code == 200, answer.text
    expected, _ = model.predict(obs, deterministic=True, action_masks=masks)
    np.testing.assert_array_equal(answer.json()["outputs"][0]["data"], expected)
    assert missing.status_code == 422
    assert "missing ['action_mask']" in missing.json()["error"]


def test_grpc_takes_the_mask_as_a_bool_tensor(
    trained: tuple[Any, Path, str], server: Server, grpc_port: int
) -> None:
    model = trained[0]
    obs, masks = batch(8, seed=6)
    observed = triton_grpc.InferInput("obs", list(obs.shape), "FP32")
    observed.set_data_from_numpy(obs)
    masked = triton_grpc.InferInput("action_mask", list(masks.shape), "BOOL")
    masked.set_data_from_numpy(masks)
    wanted = [triton_grpc.InferRequestedOutput("actions")]
    with triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        result = client.infer("masked", [observed, masked], outputs=wanted)
    expected, _ = model.predict(obs, deterministic=True, action_masks=masks)
    np.testing.assert_array_equal(result.as_numpy("actions"), expected)


def test_the_local_lane_carries_the_masks(trained: tuple[Any, Path, str], server: Server) -> None:
    model = trained[0]
    obs, masks = batch(32, seed=6)
    assert server.log is not None
    lane = server.log.parent / "lane.sock"  # where the server fixture put it
    with LaneClient(lane) as client:
        answer = client.predict(obs, model="masked", inputs={"action_masks": masks})
        with pytest.raises(RequestFailed, match="action_masks\\[0\\]: no legal action"):
            client.predict(obs[:1], model="masked", inputs={"action_masks": ~np.ones((1, 5), bool)})
    expected, _ = model.predict(obs, deterministic=True, action_masks=masks)
    np.testing.assert_array_equal(answer.actions, expected)
    with PolicyClient(server.url, lane=lane) as policy:
        one = policy.predict(obs[0], model="masked", action_masks=masks[0])
    assert int(one.actions) == int(expected[0])
