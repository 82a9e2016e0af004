"""GRPO through the server (issue #26): the ``grpo`` scenario.

The tiny Llama base policy (``examples/lm/tiny_policy.py``, built into the bench cache)
learns the toy task of ``examples/grpo_task.py`` for a fixed number of versions in each
layout, as users run it: ``examples/grpo_colocated.py`` (the server its child; sample, then
hold, learn, export, push, resume) and ``examples/grpo_decoupled.py`` (two worker threads
sampling while the trainer learns and pushes). Each run's summary gives the rates (rollout
tokens/s, trainer samples/s), the median weight update from the optimizer's last step to
the new version serving, with its parts, and the share of the wall-clock each side spends
waiting for the other. The machine's two cores are shared by the server, the workers and
the trainer (no pinning: the layouts differ in what overlaps).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import cpu

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = 30  # versions each layout trains
TIMEOUT_S = 900.0


@dataclass(frozen=True)
class LayoutRow:
    layout: str
    summary: dict[str, Any]  # the run's last line (examples/grpo_*.py)
    failure: str | None

    def get(self, key: str) -> Any:
        return self.summary.get(key, self.summary.get("totals", {}).get(key))


@dataclass(frozen=True)
class GrpoRun:
    when: str
    seconds: float
    machine: str
    load_before: str
    load_after: str
    versions: int
    rows: tuple[LayoutRow, ...]
    failure: str | None


def run(workdir: Path) -> GrpoRun:
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = cpu.machine()
    before = cpu.loadavg()
    try:
        policy = _policy()
    except RuntimeError as error:
        return GrpoRun(when, 0.0, machine, before, cpu.loadavg(), VERSIONS, (), str(error))
    rows = (
        _layout("co-located", "grpo_colocated.py", "--max-cycles", policy, workdir),
        _layout("decoupled", "grpo_decoupled.py", "--max-versions", policy, workdir),
    )
    return GrpoRun(
        when, time.monotonic() - started, machine, before, cpu.loadavg(), VERSIONS, rows, None
    )


def _policy() -> Path:
    """The recipe's llama_base directory, from the lm scenario's cache."""
    from bench import lm
    from examples.lm.tiny_policy import TinyPolicies

    lm.policy()  # builds the tiny policies into the cache unless a current build is there
    return TinyPolicies.under(lm.CACHE / "policies").llama_base


def _layout(name: str, script: str, versions: str, policy: Path, workdir: Path) -> LayoutRow:
    """One layout's run of VERSIONS versions (a target it cannot reach: it runs them all)."""
    print(f"bench: grpo {name}: {VERSIONS} versions", file=sys.stderr, flush=True)
    folder = Path(tempfile.mkdtemp(prefix=f"grpo-{name}-", dir=workdir))
    command = [
        sys.executable, str(ROOT / "examples" / script), "--policy", str(policy),
        "--serve-repository", str(folder / "models"), "--target-reward", "2",
        versions, str(VERSIONS),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return LayoutRow(name, {}, f"no summary within {TIMEOUT_S:g} s")
    lines = done.stdout.strip().splitlines()
    if not lines:
        return LayoutRow(name, {}, f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return LayoutRow(name, json.loads(lines[-1]), None)
