"""Fixtures of the ops tests: rendered manifests, and a recording kubectl on PATH."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel.errors import RLServeError
from ops.commands import rollout

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """What users apply: `kubectl kustomize k8s/overlays/OVERLAY`, parsed."""
    return render_path(K8S / "overlays" / overlay)


@cache
def render_path(path: Path) -> tuple[dict[str, Any], ...]:
    """`kubectl kustomize PATH` (any kustomization under k8s/, e.g. k8s/rl), parsed."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    done = subprocess.run(
        ["kubectl", "kustomize", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    where = path.relative_to(K8S)
    assert done.returncode == 0, f"kubectl kustomize k8s/{where} failed:\n{done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


@dataclass
class FakeKubectl:
    """The stand-in's scenario and log (tests/ops/fake_kubectl.py)."""

    scenario: Path
    log: Path

    def use(self, scenario: dict[str, Any]) -> None:
        self.scenario.write_text(json.dumps(scenario))

    def calls(self) -> list[list[str]]:
        return [c["argv"] for c in self._records()]

    def bodies(self) -> list[Any]:
        return [c["body"] for c in self._records() if c["body"] is not None]

    def _records(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKubectl:
    """A recording `kubectl` first on PATH (the real one, if any, is never reached)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    stand_in = Path(__file__).with_name("fake_kubectl.py")
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{stand_in}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    fake = FakeKubectl(tmp_path / "scenario.json", tmp_path / "kubectl.log")
    fake.use({"rules": []})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_SCENARIO", str(fake.scenario))
    monkeypatch.setenv("FAKE_KUBECTL_LOG", str(fake.log))
    return fake


def run_rollout(*argv: str) -> int:
    """`rlserve rollout ARGV...` as cli runs it: RLServeError -> one line, exit 2."""
    parser = argparse.ArgumentParser(prog="rlserve rollout")
    rollout.add_arguments(parser)
    namespace = parser.parse_args(list(argv))
    try:
        return rollout.run(namespace)
    except RLServeError as exc:
        print(f"rlserve rollout: error: {exc.message}", file=sys.stderr)
        return 2
