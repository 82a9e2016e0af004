"""gRPC under gunicorn: every worker listens on the one gRPC port (SO_REUSEPORT), so new
connections reach both, and a version pushed through one worker is what gRPC answers from
all of them."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton_grpc

from client import PolicyClient
from tests.e2e.server import free_port
from tests.load.conftest import DEMO_REPOSITORY
from tests.load.gunicorn_server import WORKERS, start_gunicorn, stop_gunicorn, worker_pids

TOKEN = "gunicorn-grpc-token"


def versions_over_new_connections(url: str, times: int) -> set[str]:
    versions = set()
    observation = triton_grpc.InferInput("obs", [1, 4], "FP32")
    observation.set_data_from_numpy(np.zeros((1, 4), np.float32))
    for _ in range(times):
        with triton_grpc.InferenceServerClient(url) as client:
            versions.add(client.infer("cartpole", [observation]).get_response().model_version)
    return versions


def test_every_worker_serves_grpc_and_follows_updates(tmp_path: Path) -> None:
    repo = tmp_path / "repository"
    shutil.copytree(DEMO_REPOSITORY, repo)
    port = free_port()
    server = start_gunicorn(repo, tmp_path, RLSERVE_GRPC_PORT=str(port), RLSERVE_ADMIN_TOKEN=TOKEN)
    url = f"127.0.0.1:{port}"
    try:
        # each worker logs it once its gRPC server is up, which may come after its "ready"
        server.wait_until(
            lambda _: server.output().count("gRPC listening on") == WORKERS, 30, "gRPC in both"
        )
        assert len(worker_pids(server)) == WORKERS
        assert versions_over_new_connections(url, 10) == {"1"}
        with PolicyClient(server.url, admin_token=TOKEN) as admin:
            pushed = admin.push("cartpole", 2, DEMO_REPOSITORY / "cartpole" / "1" / "model.onnx")
        assert pushed["all_workers"]
        assert versions_over_new_connections(url, 20) == {"2"}
    finally:
        stop_gunicorn(server)
