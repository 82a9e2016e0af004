"""The import contracts of pyproject.toml ([tool.importlinter], run by `make lint`) hold,
and each fails when one forbidden import is added: a copy of the packages with that import
added to one module is checked with the same contracts."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.ops.conftest import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
    "root_packages"
]


def lint_imports(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    chosen = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache", *chosen],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_every_contract_has_a_breaking_case() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    declared = {contract["id"] for contract in contracts["contracts"]}
    tried = {case[2] for case in BREAKING}
    assert declared == tried, f"contracts without a breaking case: {sorted(declared - tried)}"


def test_the_contracts_hold() -> None:
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


BREAKING = [  # (module, an import it may not make, the contract that forbids it)
    ("kernel/spaces.py", "serve.status", "kernel-imports-nothing"),
    ("cli/arguments.py", "export.commands", "cli-imports-kernel-only"),
    ("client/prediction.py", "serve.status", "client-imports-kernel-only"),
    ("ops/bluegreen/names.py", "serve.config", "ops-no-serve"),
    ("serve/frontends/wire.py", "serve.control.api", "dataplane-no-server-parts"),
    ("serve/frontends/wire.py", "serve.lm.text", "dataplane-no-kind"),
    ("serve/batching/split.py", "serve.frontends.oip.tensors", "floor-no-frontend"),
    ("serve/control/watcher.py", "serve.policy.heads", "control-no-kind"),
    ("serve/process/logs.py", "serve.lm.plugin", "control-no-kind"),
    ("serve/process/logs.py", "loop.controller", "serve-no-export-loop"),
    ("loop/group_names.py", "serve.frontends.predict.http", "export-loop-no-serve"),
]


@pytest.mark.parametrize(("module", "forbidden", "contract"), BREAKING)
def test_one_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, forbidden: str, contract: str
) -> None:
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    assert lint_imports(tmp_path, contract).returncode == 0  # the copy holds, as the tree does
    with (tmp_path / module).open("a") as source:
        source.write(f"\nimport {forbidden}  # noqa\n")
    run = lint_imports(tmp_path, contract)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BROKEN" in run.stdout
    assert f"{module.removesuffix('.py').replace('/', '.')} -> {forbidden}" in run.stdout


def test_control_process_and_metrics_name_no_kind() -> None:
    """They look kinds up in serve/plugins.py; a ``ModelKind.<member>`` there would be a
    branch on a concrete kind that a new kind would have to edit."""
    places = [REPO / "serve" / "control", REPO / "serve" / "process"]
    files = [f for place in places for f in place.rglob("*.py")]
    files += [REPO / "serve" / "metrics.py", REPO / "serve" / "plugins.py"]
    named = [
        f"{f.relative_to(REPO)}:{node.lineno}"
        for f in files
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ModelKind"
        and node.attr.isupper()
    ]
    assert named == []
