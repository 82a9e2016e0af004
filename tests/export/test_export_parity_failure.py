"""When parity fails the export says which output differs, exits 1 and writes nothing."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import cli
from export import writer
from export.actor_critic.pipeline import ParitySettings, export_policy
from export.sb3.source import Sb3Options, load_source
from tests.export.export_policies import TrainedPolicy


def test_a_perturbed_graph_fails_parity_on_the_value_and_writes_nothing(
    cartpole_ppo: TrainedPolicy, tmp_path: Path
) -> None:
    source = load_source(Sb3Options(cartpole_ppo.checkpoint))
    graph = copy.deepcopy(source.graph)
    with torch.no_grad():
        core: Any = graph.core
        core.policy.value_net.bias += 1e-3  # the graph no longer matches SB3's policy
    perturbed = dataclasses.replace(source, graph=graph)
    destination = writer.destination(tmp_path, "cartpole", None)
    outcome = export_policy(perturbed, ParitySettings(), destination, progress=lambda _: None)
    assert outcome.path is None
    failed = [row.output for row in outcome.report.rows if not row.passed]
    assert failed == ["value"]
    assert "parity FAILED" in outcome.report.table()
    assert list(tmp_path.iterdir()) == []


def test_tolerance_zero_on_a_box_policy_exits_1_and_writes_nothing(
    pendulum_vecnormalize: TrainedPolicy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(
        [
            "export",
            "sb3",
            str(pendulum_vecnormalize.checkpoint),
            "--vecnormalize",
            str(pendulum_vecnormalize.vecnormalize),
            "--name",
            "pendulum",
            "--model-repository",
            str(tmp_path),
            "--tolerance",
            "0",
        ]
    )
    captured = capsys.readouterr()
    assert status == 1
    assert "parity FAILED" in captured.out
    assert "FAIL" in captured.out
    assert "nothing was written" in captured.err
    assert list(tmp_path.iterdir()) == []
