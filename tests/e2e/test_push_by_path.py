"""Push by path against a real server: only regular files inside the repository are copied,
never what a link points to, within max_model_bytes; malformed paths are refused with 4xx."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import DEMO
from tests.e2e.server import Server

TOKEN = "push-by-path-test-token"
MAX_MODEL_BYTES = 4 * 1024 * 1024


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    repo = tmp_path / "repository"
    shutil.copytree(DEMO, repo / "cartpole")
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_MAX_MODEL_BYTES": str(MAX_MODEL_BYTES)}
    running = Server.rlserve(repo, env=env, log=tmp_path / "log")
    running.wait_ready()
    yield running
    running.stop()


def trainer_folder(repo: Path, version: int) -> Path:
    """A version written by a trainer into a hidden folder of the repository."""
    folder = repo / ".staging" / str(version)
    folder.mkdir(parents=True)
    shutil.copy(DEMO / "1" / "model.onnx", folder / "model.onnx")
    return folder


def push(server: Server, version: int, path: str) -> httpx.Response:
    sha256 = hashlib.sha256((DEMO / "1" / "model.onnx").read_bytes()).hexdigest()
    with server.client() as client:
        return client.put(
            f"/v1/models/cartpole/versions/{version}",
            json={"path": path, "sha256": sha256},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )


def left_in(repo: Path) -> list[str]:
    """What the model's folder holds: versions, and any staging folder left behind."""
    return sorted(p.name for p in (repo / "cartpole").iterdir() if not p.name.startswith(".s"))


def active_version(server: Server) -> int:
    with server.client() as client:
        return int(client.get("/v1/models/cartpole").json()["active_version"])


def test_links_beside_the_model_are_refused_by_name_and_nothing_is_copied(
    server: Server, tmp_path: Path
) -> None:
    repo = tmp_path / "repository"
    folder = trainer_folder(repo, 9)
    (folder / "environ").symlink_to(f"/proc/{server.process.pid}/environ")
    (folder / "passwd").symlink_to("/etc/passwd")
    answer = push(server, 9, ".staging/9/model.onnx")
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert "'environ'" in message
    assert "'passwd'" in message
    assert left_in(repo) == ["1"]  # no version 9, no staging folder
    assert active_version(server) == 1


def test_a_link_on_the_way_or_as_the_file_is_refused(server: Server, tmp_path: Path) -> None:
    repo = tmp_path / "repository"
    trainer_folder(repo, 9)
    (repo / ".alias").symlink_to(repo / ".staging")  # points inside: still a link
    (repo / ".staging" / "9" / "linked.onnx").symlink_to("model.onnx")
    through_folder = push(server, 9, ".alias/9/model.onnx")
    as_the_file = push(server, 9, ".staging/9/linked.onnx")
    assert (through_folder.status_code, as_the_file.status_code) == (422, 422)
    assert "symbolic link" in through_folder.json()["error"]["message"]
    assert "symbolic link" in as_the_file.json()["error"]["message"]
    assert left_in(repo) == ["1"]


def test_files_over_max_model_bytes_are_refused_before_any_is_copied(
    server: Server, tmp_path: Path
) -> None:
    repo = tmp_path / "repository"
    folder = trainer_folder(repo, 9)
    with open(folder / "sparse.bin", "wb") as sparse:
        sparse.truncate(MAX_MODEL_BYTES)  # no block on disk: over the limit with model.onnx
    answer = push(server, 9, ".staging/9/model.onnx")
    assert answer.status_code == 413, answer.text
    assert "max_model_bytes" in answer.json()["error"]["message"]
    assert left_in(repo) == ["1"]


def test_a_regular_version_folder_is_still_pushed_whole(server: Server, tmp_path: Path) -> None:
    repo = tmp_path / "repository"
    folder = trainer_folder(repo, 9)
    (folder / "notes.txt").write_text("a side file comes along")
    answer = push(server, 9, ".staging/9/model.onnx")
    assert answer.status_code == 200, answer.text
    assert (repo / "cartpole" / "9" / "notes.txt").read_text() == "a side file comes along"
    assert active_version(server) == 9


@pytest.mark.parametrize(
    "path",
    [
        ".staging/9/model.onnx\x00.txt",
        "a" * 100_000,
        "a/" * 3000 + "model.onnx",
        ".staging/" + "b" * 300 + "/model.onnx",
    ],
    ids=["nul", "100000-characters", "over-path-max", "overlong-name"],
)
def test_a_malformed_path_is_a_short_4xx_and_no_traceback(
    server: Server, tmp_path: Path, path: str
) -> None:
    trainer_folder(tmp_path / "repository", 9)
    answer = push(server, 9, path)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_input"
    assert len(error["message"]) < 400
    log = server.output(full=True)
    assert "Traceback" not in log
    assert "a" * 1000 not in log
    assert "b" * 300 not in log
