"""The servers under test: each started on a free loopback port, pinned or not, and stopped.

- *floor*: ``bench/floor.py``, a bare ASGI app (read the body, answer a fixed small JSON
  body) under uvicorn with the options ``rlserve serve`` uses: the cost of HTTP alone;
- *raw floor*: ``bench/raw_http.py``, the same answer from an ``asyncio.Protocol`` with
  httptools, no ASGI: the floor under the floor, what a protocol-level path could reach;
- *plain FastAPI*: ``bench/baseline.py`` under uvicorn, onnxruntime inline per request;
- *rlserve serve*: the development server, one process (``python -m cli serve``);
- *rlserve gunicorn*: the production configuration (``serve/process/gunicorn_conf.py``).

rlserve is given a repository holding only the model under test, so ``POST /predict``
reaches it. Access logs are off and the log level is ``warning`` in every server.
"""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from bench import cpu

ROOT = Path(__file__).resolve().parents[1]
_RLSERVE = [sys.executable, "-m", "cli"]
_QUIET = {
    "RLSERVE_ACCESS_LOG": "false",
    "RLSERVE_LOG_LEVEL": "warning",
    "RLSERVE_DRAIN_DELAY_S": "0",  # stop at once: nothing routes traffic to these servers
}


# The uvicorn options ``rlserve serve`` runs with (serve/commands/serve.py: httptools
# parsing, uvicorn's event loop choice, lifespan on, no access log, no Server header, logs
# at warning), given to the floor so that only the application differs.
RLSERVE_UVICORN = [
    "--http", "httptools", "--loop", "auto", "--lifespan", "on", "--no-access-log",
    "--no-server-header", "--log-level", "warning",
]  # fmt: skip


class Kind(enum.Enum):
    RAW_FLOOR = "raw-floor"
    FLOOR = "floor"
    BASELINE = "baseline"
    SERVE = "serve"
    GUNICORN = "gunicorn"


@dataclass(frozen=True)
class Setup:
    """One way of serving a model: which server, how many workers, on which core."""

    key: str
    label: str
    kind: Kind
    core: int | None = cpu.SERVER_CORE  # None: not pinned
    workers: int = 1


RAW_FLOOR = Setup("raw-floor", "floor: raw protocol (asyncio + httptools)", Kind.RAW_FLOOR)
FLOOR = Setup("floor", "floor: bare ASGI on uvicorn", Kind.FLOOR)
BASELINE = Setup("baseline", "plain FastAPI, ORT inline", Kind.BASELINE)
SERVE = Setup("serve", "rlserve serve (1 process)", Kind.SERVE)
GUNICORN_1 = Setup("gunicorn-1", "rlserve gunicorn (1 worker)", Kind.GUNICORN)


def gunicorn_unpinned(workers: int) -> Setup:
    """gunicorn free to use every core, wrk's included: how throughput scales, not a cost."""
    label = f"rlserve gunicorn ({workers} workers, not pinned)"
    return Setup("gunicorn-n", label, Kind.GUNICORN, core=None, workers=workers)


class Server:
    """A command started on a free port (given as ``{port}`` and RLSERVE_PORT), in ``cwd``
    (default: this one)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        log: Path,
        core: int | None,
        cwd: Path | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        full_env = {
            **os.environ,
            **_QUIET,
            "RLSERVE_HOST": "127.0.0.1",
            "RLSERVE_PORT": str(self.port),
            **env,
        }
        args = cpu.pinned([a.replace("{port}", str(self.port)) for a in command], core)
        with log.open("w") as out:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                args, env=full_env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd
            )

    def cpu_seconds(self) -> float:
        """CPU seconds spent so far by the server and all its processes (gunicorn workers)."""
        return cpu.tree_seconds(self.process.pid)

    def wait_until(
        self, check: Callable[[httpx.Client], bool], what: str, timeout_s: float
    ) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(
                        f"server exited with {self.process.returncode}:\n{self.log_tail()}"
                    )
                try:
                    if check(client):
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"server not {what} after {timeout_s:g}s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM (a graceful stop, prompt with no drain delay), SIGKILL if it lingers;
        then SIGKILL for any process of the tree still alive (gunicorn workers whose master
        had to be killed would otherwise keep running)."""
        family = _descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()

    def log_tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""


def start(
    setup: Setup, model: Path, workdir: Path, probe: bytes = b"", timeout_s: float = 120
) -> Server:
    """``setup`` serving the model folder ``model`` (<repository>/<name>), once ready.

    Ready means ``GET /ready`` answers 200 (rlserve), or ``probe`` is answered 200 by
    ``POST /predict`` (the floors and the baseline, which have no readiness endpoint).
    """
    log = workdir / f"{model.name}-{setup.key}.log"
    if setup.kind in (Kind.RAW_FLOOR, Kind.FLOOR, Kind.BASELINE):
        server = _reference(setup, model, log)
        server.wait_until(
            lambda c: c.post("/predict", content=probe).status_code == 200, "serving", timeout_s
        )
        return server
    repository = only_model(model, workdir)
    if setup.kind is Kind.SERVE:
        command = [*_RLSERVE, "serve", "--model-repository", str(repository)]
        server = Server(command, {}, log, setup.core)
    else:
        server = _gunicorn(repository, setup, workdir, log)
    server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", timeout_s)
    return server


def _reference(setup: Setup, model: Path, log: Path) -> Server:
    """A server to read rlserve's figures against: a floor, or plain FastAPI."""
    if setup.kind is Kind.RAW_FLOOR:
        command = [sys.executable, "-m", "bench.raw_http", "--port", "{port}"]
        return Server(command, {}, log, setup.core)
    if setup.kind is Kind.FLOOR:
        return _floor(log, setup.core)
    return _baseline(newest_onnx(model), log, setup.core)


def _floor(log: Path, core: int | None) -> Server:
    command = [
        sys.executable, "-m", "uvicorn", "bench.floor:app", "--host", "127.0.0.1",
        "--port", "{port}", *RLSERVE_UVICORN,
    ]  # fmt: skip
    return Server(command, {}, log, core)


def _baseline(onnx: Path, log: Path, core: int | None) -> Server:
    command = [
        sys.executable, "-m", "uvicorn", "--factory", "bench.baseline:create_app",
        "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    return Server(command, {"BASELINE_MODEL": str(onnx)}, log, core)


def _gunicorn(repository: Path, setup: Setup, workdir: Path, log: Path) -> Server:
    env = {
        "RLSERVE_MODEL_REPOSITORY": str(repository),
        "RLSERVE_WORKERS": str(setup.workers),
        "PROMETHEUS_MULTIPROC_DIR": str(workdir / f"metrics-{repository.name}-{setup.key}"),
    }
    config = ROOT / "serve" / "gunicorn.conf.py"
    return Server([sys.executable, "-m", "gunicorn", "--config", str(config)], env, log, setup.core)


def newest_onnx(model: Path) -> Path:
    """The newest version's model.onnx in a model's folder."""
    versions = sorted(model.glob("*/model.onnx"), key=lambda p: int(p.parent.name))
    if not versions:
        raise FileNotFoundError(f"no <version>/model.onnx under {model}")
    return versions[-1]


def only_model(model: Path, workdir: Path) -> Path:
    """A repository holding only ``model``, so that it answers ``POST /predict``."""
    repository = workdir / f"only-{model.name}"
    if not repository.exists():
        shutil.copytree(model, repository / model.name)
    return repository


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
