"""``rlserve serve FILE.onnx`` and the service guide's config file, against real servers:
one exported file served without a repository, and ``service.workers`` honoured by running
gunicorn."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import DEMO
from tests.e2e.server import RLSERVE, Server
from tests.load.gunicorn_server import ready_workers, stop_gunicorn, worker_pids

REFERENCE = Path(__file__).resolve().parents[2] / "configs" / "service_config.yaml"
OBSERVATION = {"observations": [0.01, -0.02, 0.03, 0.04]}


@pytest.fixture
def loose_file(tmp_path: Path) -> Path:
    """An exported policy outside any repository, as the guide keeps it: /models/ppo.onnx."""
    path = tmp_path / "models" / "ppo.onnx"
    path.parent.mkdir()
    shutil.copy(DEMO / "1" / "model.onnx", path)
    return path


def test_one_file_is_served_at_predict_named_for_the_file(loose_file: Path, tmp_path: Path) -> None:
    server = Server([*RLSERVE, "serve", str(loose_file)], log=tmp_path / "server.log")
    try:
        server.wait_ready()
        with server.client() as client:
            answer = client.post("/predict", json=OBSERVATION).json()
            named = client.post("/v1/models/ppo/predict", json=OBSERVATION).json()
            models = client.get("/v1/models").json()
            pushed = client.put("/v1/models/ppo/versions/2", content=loose_file.read_bytes())
    finally:
        server.stop()
    assert (answer["model"], answer["model_version"]) == ("ppo", 1)
    assert answer == named
    assert [m["name"] for m in models["models"]] == ["ppo"]
    assert pushed.status_code == 403  # read-only: no admin token can be configured


def test_a_version_directory_keeps_its_name_and_version(tmp_path: Path) -> None:
    version = tmp_path / "models" / "pendulum" / "3"
    shutil.copytree(DEMO / "1", version)
    server = Server([*RLSERVE, "serve", str(version / "model.onnx")], log=tmp_path / "s.log")
    try:
        server.wait_ready()
        with server.client() as client:
            answer = client.post("/predict", json=OBSERVATION).json()
    finally:
        server.stop()
    assert (answer["model"], answer["model_version"]) == ("pendulum", 3)


def test_a_file_with_live_updates_configured_is_refused_before_serving(loose_file: Path) -> None:
    done = subprocess.run(
        [*RLSERVE, "serve", str(loose_file), "--poll-interval-s", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "poll_interval_s is set, but model_file" in done.stderr
    assert "--model-repository DIR" in done.stderr


def test_the_service_guides_config_runs_its_workers_on_its_model(
    loose_file: Path, tmp_path: Path
) -> None:
    """The guide's file with its path pointed at a real file: 2 workers here (its 4 would
    crowd this machine), the port chosen by the test (RLSERVE_PORT outranks the file)."""
    text = REFERENCE.read_text().replace("/models/ppo.onnx", str(loose_file))
    config = tmp_path / "service_config.yaml"
    config.write_text(text.replace("workers: 4", "workers: 2"))
    server = Server(
        [*RLSERVE, "serve", "--config", str(config)],
        env={
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
            "XDG_RUNTIME_DIR": str(tmp_path),
        },
        log=tmp_path / "gunicorn.log",
    )
    try:
        server.wait_until(lambda _: ready_workers(server) == 2, 60, "ready in both workers")
        server.wait_ready()
        workers = worker_pids(server)
        with server.client() as client:
            answers = [client.post("/predict", json=OBSERVATION) for _ in range(20)]
            batching = client.get("/v1/models/ppo").json()["batching"]
    finally:
        stop_gunicorn(server)
    assert len(workers) == 2
    assert {a.status_code for a in answers} == {200}
    assert batching["max_batch_size"] == 32  # model.batch_size
    assert server.process.returncode == 0
    assert "running gunicorn" in server.output(full=True)


def test_sigterm_to_the_one_command_production_server_drains_it(
    loose_file: Path, tmp_path: Path
) -> None:
    server = Server(
        [*RLSERVE, "serve", str(loose_file), "--workers", "2"],
        env={
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
            "XDG_RUNTIME_DIR": str(tmp_path),
        },
        log=tmp_path / "gunicorn.log",
    )
    server.wait_until(lambda _: ready_workers(server) == 2, 60, "ready in both workers")
    with httpx.Client(base_url=server.url) as client:
        assert client.post("/predict", json=OBSERVATION).status_code == 200
    assert server.stop(signal.SIGTERM) == 0
