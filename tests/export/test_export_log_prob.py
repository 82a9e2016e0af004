"""log_prob from kernel.distributions on the exported parameters equals SB3's evaluate_actions."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from stable_baselines3 import A2C, PPO

from kernel.distributions import DistributionKind, build
from kernel.spaces import leaves, sample
from tests.export.export_policies import ExportedPolicy, TrainedPolicy

KINDS = {
    "cartpole_ppo": DistributionKind.CATEGORICAL,
    "multidiscrete": DistributionKind.MULTI_CATEGORICAL,
    "multibinary": DistributionKind.BERNOULLI,
    "pendulum_vecnormalize": DistributionKind.DIAG_GAUSSIAN,
}


@pytest.mark.parametrize("name", list(KINDS))
def test_log_prob_of_given_actions_equals_evaluate_actions(
    name: str, request: pytest.FixtureRequest, export_sb3: Any
) -> None:
    trained: TrainedPolicy = request.getfixturevalue(name)
    exported: ExportedPolicy = export_sb3(trained)
    policy = exported.contract
    assert policy.distribution.kind is KINDS[name]
    rng = np.random.default_rng(7)
    observations = {k: sample(leaf, rng, 64) for k, leaf in leaves(policy.observation_space)}
    outputs = _onnx_outputs(exported, observations[None])
    nvec = tuple(policy.distribution.nvec) if policy.distribution.nvec else None
    distribution = build(policy.distribution.kind, outputs, nvec)
    for actions in (distribution.sample(rng), distribution.mode()):
        ours = distribution.log_prob(actions)
        theirs = _evaluate_actions(trained, observations[None], actions, policy.distribution.kind)
        np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


def _onnx_outputs(exported: ExportedPolicy, observations: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"obs": observations}), strict=True))


def _evaluate_actions(
    trained: TrainedPolicy, observations: np.ndarray, actions: np.ndarray, kind: DistributionKind
) -> np.ndarray:
    model = (A2C if trained.name == "multibinary" else PPO).load(trained.checkpoint, device="cpu")
    if trained.vecnormalize is not None:
        with trained.vecnormalize.open("rb") as f:
            observations = pickle.load(f).normalize_obs(observations)  # SB3's own VecNormalize
    floating = kind in (DistributionKind.BERNOULLI, DistributionKind.DIAG_GAUSSIAN)
    with torch.no_grad():
        obs, _ = model.policy.obs_to_tensor(observations)
        given = torch.as_tensor(actions, dtype=torch.float32 if floating else torch.int64)
        _, log_prob, _ = model.policy.evaluate_actions(obs, given)
    result: np.ndarray = log_prob.numpy()
    return result
