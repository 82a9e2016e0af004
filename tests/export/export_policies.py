"""The trained and exported policies the export tests share (the fixtures are in conftest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env

from export import writer
from export.actor_critic.pipeline import ParitySettings, export_policy
from export.sb3.source import Sb3Options, load_source
from kernel import contract
from kernel.contract import PolicyContract
from tests.export.export_envs import CartPoleNoVelocity


@dataclass(frozen=True)
class TrainedPolicy:
    name: str
    checkpoint: Path
    make_env: Callable[[], gym.Env[Any, Any]]
    vecnormalize: Path | None = None


@dataclass(frozen=True)
class ExportedPolicy:
    trained: TrainedPolicy
    path: Path
    contract: PolicyContract
    parity_table: str
    max_diffs: dict[str, float]


def export_with_library(trained: TrainedPolicy, repository: Path) -> ExportedPolicy:
    source = load_source(Sb3Options(trained.checkpoint, vecnormalize=trained.vecnormalize))
    destination = writer.destination(repository, trained.name, None)
    outcome = export_policy(source, ParitySettings(), destination, progress=lambda _: None)
    assert outcome.path is not None, outcome.report.table()
    return ExportedPolicy(
        trained=trained,
        path=outcome.path,
        contract=contract.read(outcome.path),
        parity_table=outcome.report.table(),
        max_diffs={row.output: row.max_abs_diff for row in outcome.report.rows},
    )


RECURRENT_HIDDEN = 32  # the LSTMs' width: 4 x 32 floats of state per step


def train_recurrent_ppo(path: Path) -> None:
    """RecurrentPPO (MlpLstmPolicy), a few thousand steps on CartPole with its velocities
    hidden, saved at ``path``: the recurrent policy the export and e2e tests share (trained
    once per test run: the ``recurrent_ppo`` fixture of tests/conftest.py)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny network: more threads only contend with the others
    try:
        _learn_recurrent_ppo(path)
    finally:
        torch.set_num_threads(previous)


def _learn_recurrent_ppo(path: Path) -> None:
    venv = make_vec_env(CartPoleNoVelocity, n_envs=4, seed=0)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        venv,
        n_steps=128,
        batch_size=128,
        n_epochs=4,
        policy_kwargs={"lstm_hidden_size": RECURRENT_HIDDEN, "net_arch": [32]},
        seed=0,
        device="cpu",
    )
    model.learn(4096)
    model.save(path)
