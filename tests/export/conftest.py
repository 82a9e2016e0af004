"""Tiny policies trained in seconds, shared by the export tests (session scope).

Training quality does not matter for parity; every checkpoint is saved under the session's
temporary directory and exported at most once per session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

from tests.export.export_envs import DictEnv, ImageEnv, MultiBinaryEnv, MultiDiscreteEnv
from tests.export.export_policies import ExportedPolicy, TrainedPolicy, export_with_library

TIMESTEPS = 128
PPO_SETTINGS = {"n_steps": 64, "batch_size": 64, "n_epochs": 2}


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks; the machine's other cores are busy
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


def _train(algorithm: Any, policy: str, venv: Any, path: Path, **settings: Any) -> Path:
    model = algorithm(policy, venv, seed=0, device="cpu", **settings)
    model.learn(total_timesteps=TIMESTEPS)
    model.save(path)
    return path


def _gym(env_id: str) -> Callable[[], gym.Env[Any, Any]]:
    return lambda: gym.make(env_id)


@pytest.fixture(scope="session")
def cartpole_ppo(models_dir: Path) -> TrainedPolicy:
    venv = make_vec_env("CartPole-v1", n_envs=1, seed=0)
    path = _train(PPO, "MlpPolicy", venv, models_dir / "cartpole_ppo.zip", **PPO_SETTINGS)
    return TrainedPolicy("cartpole_ppo", path, _gym("CartPole-v1"))


@pytest.fixture(scope="session")
def cartpole_a2c(models_dir: Path) -> TrainedPolicy:
    venv = make_vec_env("CartPole-v1", n_envs=1, seed=0)
    path = _train(A2C, "MlpPolicy", venv, models_dir / "cartpole_a2c.zip", n_steps=8)
    return TrainedPolicy("cartpole_a2c", path, _gym("CartPole-v1"))


@pytest.fixture(scope="session")
def pendulum_vecnormalize(models_dir: Path) -> TrainedPolicy:
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0))
    path = _train(PPO, "MlpPolicy", venv, models_dir / "pendulum.zip", **PPO_SETTINGS)
    stats = models_dir / "pendulum_vecnormalize.pkl"
    venv.save(str(stats))
    return TrainedPolicy("pendulum_vecnormalize", path, _gym("Pendulum-v1"), stats)


@pytest.fixture(scope="session")
def multidiscrete(models_dir: Path) -> TrainedPolicy:
    venv = make_vec_env(MultiDiscreteEnv, n_envs=1, seed=0)
    path = _train(PPO, "MlpPolicy", venv, models_dir / "multidiscrete.zip", **PPO_SETTINGS)
    return TrainedPolicy("multidiscrete", path, MultiDiscreteEnv)


@pytest.fixture(scope="session")
def multibinary(models_dir: Path) -> TrainedPolicy:
    venv = make_vec_env(MultiBinaryEnv, n_envs=1, seed=0)
    path = _train(A2C, "MlpPolicy", venv, models_dir / "multibinary.zip", n_steps=8)
    return TrainedPolicy("multibinary", path, MultiBinaryEnv)


@pytest.fixture(scope="session")
def image_cnn(models_dir: Path) -> TrainedPolicy:
    venv = make_vec_env(ImageEnv, n_envs=1, seed=0)
    path = _train(PPO, "CnnPolicy", venv, models_dir / "image_cnn.zip", **PPO_SETTINGS)
    return TrainedPolicy("image_cnn", path, ImageEnv)


@pytest.fixture(scope="session")
def dict_multi_input(models_dir: Path) -> TrainedPolicy:
    """MultiInputPolicy under VecNormalize of the 'position' key only."""
    venv = VecNormalize(make_vec_env(DictEnv, n_envs=1, seed=0), norm_obs_keys=["position"])
    path = _train(PPO, "MultiInputPolicy", venv, models_dir / "dict.zip", **PPO_SETTINGS)
    stats = models_dir / "dict_vecnormalize.pkl"
    venv.save(str(stats))
    return TrainedPolicy("dict_multi_input", path, DictEnv, stats)


@pytest.fixture(scope="session")
def export_sb3(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[TrainedPolicy], ExportedPolicy]:
    """Export a trained policy with the library API, once per session."""
    repository = tmp_path_factory.mktemp("repository")
    done: dict[str, ExportedPolicy] = {}

    def export(trained: TrainedPolicy) -> ExportedPolicy:
        if trained.name not in done:
            done[trained.name] = export_with_library(trained, repository)
        return done[trained.name]

    return export
