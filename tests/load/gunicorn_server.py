"""The production server: gunicorn with rlserve's config and 2 workers, on a free port.

Each test gets its own metrics folder (PROMETHEUS_MULTIPROC_DIR) and gunicorn control
socket (XDG_RUNTIME_DIR), so that servers never share state.
"""

from __future__ import annotations

import signal
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
from prometheus_client.multiprocess import MultiProcessCollector

from tests.e2e.server import Server
from tests.load.locust_runs import REPO

GUNICORN_CONFIG = REPO / "serve" / "process" / "gunicorn_conf.py"
GUNICORN = [sys.executable, "-m", "gunicorn", "--config", str(GUNICORN_CONFIG)]
WORKERS = 2


def start_gunicorn(repository: Path, tmp: Path, **env: str) -> Server:
    """gunicorn with both workers ready (each worker logs 'ready after' once loaded)."""
    server = Server(GUNICORN, {**_environment(repository, tmp), **env}, log=tmp / "gunicorn.log")
    server.wait_until(lambda _: ready_workers(server) == WORKERS, 60, "ready in both workers")
    server.wait_ready()
    return server


def _environment(repository: Path, tmp: Path) -> dict[str, str]:
    return {
        "RLSERVE_MODEL_REPOSITORY": str(repository),
        "RLSERVE_WORKERS": str(WORKERS),
        "RLSERVE_ACCESS_LOG": "false",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics"),
        "XDG_RUNTIME_DIR": str(tmp),
    }


def stop_gunicorn(server: Server) -> None:
    """A graceful stop (SIGTERM); workers left behind by a master that had to be killed are
    killed too. (SIGINT, gunicorn's quick shutdown, leaves uvicorn workers running until
    gunicorn's graceful_timeout.)"""
    running = server.process.poll() is None
    workers = [psutil.Process(pid) for pid in worker_pids(server)] if running else []
    server.stop(signal.SIGTERM)
    for worker in workers:
        if worker.is_running():
            worker.kill()


def ready_workers(server: Server) -> int:
    assert server.log is not None
    return server.log.read_text().count("rlserve.phases: ready after")


def worker_pids(server: Server) -> set[int]:
    return {child.pid for child in psutil.Process(server.process.pid).children()}


def wait_for_replacement(server: Server, gone: int, timeout_s: float = 30) -> int:
    """The pid of the worker that gunicorn started in place of ``gone``."""
    before = worker_pids(server) | {gone}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = worker_pids(server)
        if gone not in pids and len(pids) == WORKERS:
            return (pids - before).pop()
        time.sleep(0.05)
    raise TimeoutError(f"gunicorn did not replace worker {gone}: {server.output()}")


def answered(tmp: Path) -> Counter[tuple[str, str]]:
    """rlserve_requests_total by (worker pid, status), read from every worker's metrics file
    (counters of exited workers stay there, and this works after the server has exited)."""
    counts: Counter[tuple[str, str]] = Counter()
    for path in sorted((tmp / "metrics").glob("counter_*.db")):
        if path.stat().st_size == 0:
            continue  # a worker is creating it this instant: nothing counted in it yet
        pid = path.stem.removeprefix("counter_")
        for metric in MultiProcessCollector.merge([str(path)]):
            for sample in metric.samples:
                if sample.name == "rlserve_requests_total":
                    counts[pid, sample.labels["status"]] += int(sample.value)
    return counts


def answered_by_worker(tmp: Path) -> Counter[int]:
    """rlserve_requests_total by worker pid, every status."""
    by_pid: Counter[int] = Counter()
    for (pid, _), count in answered(tmp).items():
        by_pid[int(pid)] += count
    return by_pid


def wait_for_traffic(tmp: Path, requests: int = 500, timeout_s: float = 30) -> Counter[int]:
    """Answers by worker pid, once the workers have answered ``requests`` in all."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        by_pid = answered_by_worker(tmp)
        if sum(by_pid.values()) >= requests:
            return by_pid
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {requests} requests answered in {timeout_s}s")
