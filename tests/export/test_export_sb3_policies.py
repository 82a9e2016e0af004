"""Every kind of SB3 policy exports with parity, a complete contract, and identical episodes."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import stable_baselines3
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import serve
from kernel import contract
from kernel.spaces import from_gymnasium
from tests.export.export_policies import ExportedPolicy, TrainedPolicy
from tests.export.export_rollouts import OnnxActor, assert_same_episode, run_episode, sb3_actor

ALL = [
    "cartpole_ppo",
    "cartpole_a2c",
    "pendulum_vecnormalize",
    "multidiscrete",
    "multibinary",
    "image_cnn",
    "dict_multi_input",
]
WITHOUT_VECNORMALIZE = ["cartpole_ppo", "cartpole_a2c", "multidiscrete", "multibinary", "image_cnn"]
WITH_VECNORMALIZE = ["pendulum_vecnormalize", "dict_multi_input"]

# name -> (algorithm, distribution, nvec, inputs (name, dtype, shape), outputs, normalised keys,
#          image layouts, action clip)
EXPECTED: dict[str, tuple[Any, ...]] = {
    "cartpole_ppo": (
        "ppo", "categorical", None, [("obs", "float32", ["batch", 4])],
        ["action", "logits", "value"], None, [], False,
    ),
    "cartpole_a2c": (
        "a2c", "categorical", None, [("obs", "float32", ["batch", 4])],
        ["action", "logits", "value"], None, [], False,
    ),
    "pendulum_vecnormalize": (
        "ppo", "diag_gaussian", None, [("obs", "float32", ["batch", 3])],
        ["action", "mean", "log_std", "value"], [None], [], True,
    ),
    "multidiscrete": (
        "ppo", "multi_categorical", [3, 2], [("obs", "float32", ["batch", 4])],
        ["action", "logits", "value"], None, [], False,
    ),
    "multibinary": (
        "a2c", "bernoulli", None, [("obs", "float32", ["batch", 3])],
        ["action", "logits", "value"], None, [], False,
    ),
    "image_cnn": (
        "ppo", "categorical", None, [("obs", "uint8", ["batch", 36, 36, 3])],
        ["action", "logits", "value"], None, [(None, "HWC", True)], False,
    ),
    "dict_multi_input": (
        "ppo", "diag_gaussian", None,
        [
            ("obs.camera", "uint8", ["batch", 36, 36, 3]),
            ("obs.mode", "int64", ["batch"]),
            ("obs.position", "float32", ["batch", 3]),
        ],
        ["action", "mean", "log_std", "value"], ["position"], [("camera", "HWC", True)], True,
    ),
}  # fmt: skip


@pytest.fixture(params=ALL)
def exported(request: pytest.FixtureRequest, export_sb3: Any) -> ExportedPolicy:
    result: ExportedPolicy = export_sb3(request.getfixturevalue(request.param))
    return result


def test_parity_holds_within_the_default_tolerance(exported: ExportedPolicy) -> None:
    print(f"\n{exported.trained.name}\n{exported.parity_table}")
    assert all(diff <= 1e-5 for diff in exported.max_diffs.values()), exported.parity_table
    assert "log_prob" in exported.max_diffs


def test_the_contract_declares_spaces_tensors_and_preprocessing(exported: ExportedPolicy) -> None:
    algorithm, kind, nvec, inputs, outputs, normalised, images, clip = EXPECTED[
        exported.trained.name
    ]
    policy = exported.contract
    env = exported.trained.make_env()
    assert policy.algorithm.value == algorithm
    assert policy.distribution.kind.value == kind
    assert policy.distribution.nvec == nvec
    assert policy.observation_space == from_gymnasium(env.observation_space)  # raw, HWC images
    assert policy.action_space == from_gymnasium(env.action_space)
    assert [(i.name, i.dtype, i.shape) for i in policy.inputs] == inputs
    assert [o.name for o in policy.outputs] == outputs
    prep = policy.preprocessing
    assert (prep.normalization.keys if prep.normalization else None) == normalised
    assert [(i.key, i.layout, i.transposed_to_chw) for i in prep.images] == images
    assert all(i.scale == pytest.approx(1 / 255) for i in prep.images)
    assert prep.action_clip is clip


def test_the_contract_records_provenance_versions_and_golden_vectors(
    exported: ExportedPolicy,
) -> None:
    policy = exported.contract
    checkpoint = exported.trained.checkpoint
    assert policy.source.framework == "stable-baselines3"
    assert policy.source.framework_version == stable_baselines3.__version__
    assert policy.source.checkpoint == checkpoint.name
    assert policy.source.sha256 == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert policy.source.policy_class.startswith("stable_baselines3.common.policies.")
    assert (policy.policy_version, policy.opset) == (1, 18)
    assert policy.exporter.version == serve.__version__
    assert datetime.fromisoformat(policy.created_at).utcoffset() is not None
    assert len(policy.golden) == 4
    assert policy.golden_atol == 1e-4
    assert contract.check_golden(policy, _runner(exported)) == []


def test_the_batch_axis_is_dynamic(exported: ExportedPolicy) -> None:
    session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    assert all(i.shape[0] == "batch" for i in session.get_inputs())
    for rows in (1, 7):
        observations = exported.trained.make_env().observation_space.sample()
        many = _repeat(observations, rows)
        outputs = _runner(exported)(exported.contract.observation_feeds(many))
        assert all(len(value) == rows for value in outputs.values())


@pytest.mark.parametrize("name", WITHOUT_VECNORMALIZE)
def test_an_onnxruntime_episode_takes_the_same_actions_as_sb3_predict(
    name: str, request: pytest.FixtureRequest, export_sb3: Any
) -> None:
    trained: TrainedPolicy = request.getfixturevalue(name)
    exported: ExportedPolicy = export_sb3(trained)
    model = _load(trained)
    for seed in (0, 1):
        ours = run_episode(trained.make_env(), OnnxActor(exported.path), seed)
        theirs = run_episode(trained.make_env(), sb3_actor(model), seed)
        assert_same_episode(ours, theirs)


@pytest.mark.parametrize("name", WITH_VECNORMALIZE)
def test_with_its_stats_the_export_acts_like_sb3_under_vecnormalize_on_raw_observations(
    name: str, request: pytest.FixtureRequest, export_sb3: Any
) -> None:
    trained: TrainedPolicy = request.getfixturevalue(name)
    exported: ExportedPolicy = export_sb3(trained)
    model = _load(trained)
    assert trained.vecnormalize is not None
    venv = VecNormalize.load(str(trained.vecnormalize), DummyVecEnv([trained.make_env]))
    venv.training, venv.norm_reward = False, False
    for seed in (0, 1):
        ours = run_episode(trained.make_env(), OnnxActor(exported.path), seed)
        theirs = _vec_episode(venv, model, seed)
        assert_same_episode(ours, theirs, atol=1e-5)


def _vec_episode(venv: VecNormalize, model: Any, seed: int) -> Any:
    """SB3's own loop: VecNormalize normalises the raw observations before predict."""
    from tests.export.export_rollouts import Episode

    venv.seed(seed)
    observation: Any = venv.reset()
    actions, total = [], 0.0
    while True:
        action, _ = model.predict(observation, deterministic=True)
        observation, reward, done, _ = venv.step(action)
        actions.append(action[0])
        total += float(reward[0])
        if done[0]:
            return Episode(actions, total)


def _load(trained: TrainedPolicy) -> Any:
    cls = A2C if trained.name in ("cartpole_a2c", "multibinary") else PPO
    return cls.load(trained.checkpoint, device="cpu")


def _runner(exported: ExportedPolicy) -> Any:
    session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds), strict=True))


def _repeat(observation: Any, rows: int) -> Any:
    if isinstance(observation, dict):
        return {k: np.stack([np.asarray(v)] * rows).tolist() for k, v in observation.items()}
    return np.stack([observation] * rows).tolist()
