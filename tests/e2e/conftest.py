"""Model repositories built with the real exporter, and servers started on them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.server import RLSERVE, Server
from tests.export.export_envs import DictEnv

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "model_repository" / "cartpole"


def export_untrained(
    tmp: Path, repository: Path, name: str, env: Any, net_arch: list[int], seed: int = 0
) -> None:
    """An untrained SB3 PPO (weights are random, exactness is what matters) through the CLI.

    ``env`` is a gymnasium id or an environment; Dict observations get MultiInputPolicy."""
    from stable_baselines3 import PPO

    checkpoint = tmp / f"{name}-{seed}.zip"
    policy = "MultiInputPolicy" if isinstance(env, DictEnv) else "MlpPolicy"
    kwargs = {"net_arch": net_arch}
    PPO(policy, env, policy_kwargs=kwargs, seed=seed, device="cpu").save(checkpoint)
    subprocess.run(
        [*RLSERVE, "export", "sb3", str(checkpoint), "--name", name,
         "--model-repository", str(repository), "--parity-samples", "32"],
        check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cartpole (the bundled, trained demo), pendulum (Box actions), heavy (a wide MLP), and
    dict (Dict observations: an image, a discrete mode, a vector)."""
    tmp = tmp_path_factory.mktemp("models")
    repo = tmp / "repository"
    shutil.copytree(DEMO, repo / "cartpole")
    export_untrained(tmp, repo, "pendulum", "Pendulum-v1", [64, 64])
    export_untrained(tmp, repo, "heavy", "CartPole-v1", [1024, 1024])
    export_untrained(tmp, repo, "dict", DictEnv(), [32])
    return repo


def only(repository: Path, tmp: Path, *names: str, config: str | None = None) -> Path:
    """A repository holding some of the models (and a config.yaml for the first)."""
    repo = tmp / ("repo-" + "-".join(names))
    for name in names:
        shutil.copytree(repository / name, repo / name)
    if config is not None:
        (repo / names[0] / "config.yaml").write_text(config)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server on cartpole, pendulum and dict, shared by a test module."""
    tmp = tmp_path_factory.mktemp("server")
    repo = only(repository, tmp, "cartpole", "pendulum", "dict")
    running = Server.rlserve(repo, "--default-model", "cartpole", log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()
