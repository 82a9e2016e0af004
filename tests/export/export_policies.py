"""The trained and exported policies the export tests share (the fixtures are in conftest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from export import writer
from export.actor_critic.pipeline import ParitySettings, export_policy
from export.sb3.source import Sb3Options, load_source
from serve import contract
from serve.contract import PolicyContract


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
