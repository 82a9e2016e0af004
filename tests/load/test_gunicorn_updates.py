"""One version across every gunicorn worker: an update received by one worker is recorded in
the repository and followed by the others, and the answer says which workers serve it."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import httpx

from client import PolicyClient
from tests.load.conftest import DEMO_REPOSITORY
from tests.load.fresh_connections import OBSERVATION, PREDICT
from tests.load.gunicorn_server import WORKERS, start_gunicorn, stop_gunicorn, worker_pids

TOKEN = "gunicorn-updates-token"
DEMO_MODEL = DEMO_REPOSITORY / "cartpole" / "1" / "model.onnx"


def demo_copy(tmp: Path) -> Path:
    repo = tmp / "repository"
    shutil.copytree(DEMO_REPOSITORY, repo)
    return repo


def fresh(url: str, method: str, path: str, times: int, **kwargs: object) -> list[httpx.Response]:
    """The same call on a new connection each time: any worker may take each one."""
    headers = {"Connection": "close"}
    with httpx.Client(base_url=url, timeout=10, headers=headers) as client:
        return [client.request(method, path, **kwargs) for _ in range(times)]  # type: ignore[arg-type]


def versions_served(url: str, times: int = 40) -> Counter[int]:
    answers = fresh(url, "POST", PREDICT, times, json=OBSERVATION)
    return Counter(a.json()["model_version"] for a in answers)


def workers_in(report: dict[str, object]) -> set[int]:
    workers = report["workers"]
    assert isinstance(workers, dict)
    return {int(name.rsplit(":", 1)[1]) for name in workers}


def test_push_rollback_and_hold_reach_every_worker_and_say_so(tmp_path: Path) -> None:
    repo = demo_copy(tmp_path)
    server = start_gunicorn(repo, tmp_path, RLSERVE_ADMIN_TOKEN=TOKEN, RLSERVE_DRAIN_DELAY_S="0")
    try:
        pids = worker_pids(server)
        with PolicyClient(server.url, admin_token=TOKEN) as admin:
            pushed = admin.push("cartpole", 2, DEMO_MODEL)
            assert (pushed["all_workers"], workers_in(pushed)) == (True, pids)
            assert set(pushed["workers"].values()) == {2}
            assert versions_served(server.url) == {2: 40}

            rolled = admin.rollback("cartpole")
            assert (rolled["all_workers"], set(rolled["workers"].values())) == (True, {1})
            assert versions_served(server.url) == {1: 40}

            admin.hold("cartpole")
            held = fresh(server.url, "GET", "/ready", 4 * WORKERS)
            assert {r.status_code for r in held} == {503}
            assert all("held" in r.text for r in held)
            admin.resume("cartpole")
        server.wait_until(
            lambda c: all(r.status_code == 200 for r in fresh(server.url, "GET", "/ready", 8)),
            10,
            "ready on every worker after resume",
        )
        assert (repo / "cartpole" / "2" / "model.onnx").read_bytes() == DEMO_MODEL.read_bytes()
    finally:
        stop_gunicorn(server)
