"""The gunicorn server under test: its master and workers, found or started here.

The workers of a gunicorn server are the children of its master. Attached to a running
server, the run finds the master from the port (the processes listening on it are the
master and its workers; the master is the one whose parent is not among them). With
``--start-server`` it starts gunicorn itself, with rlserve's config, on a copy of the
repository.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]
GUNICORN_CONFIG = REPO / "serve" / "gunicorn.conf.py"


class ServerNotFound(Exception):
    """No gunicorn master could be found or started."""


@dataclass(frozen=True)
class Gunicorn:
    master: int

    def workers(self) -> list[int]:
        """The worker pids, oldest first (none once the master has exited)."""
        try:
            children = psutil.Process(self.master).children()
        except psutil.NoSuchProcess:
            return []
        return [c.pid for c in sorted(children, key=_started_at)]

    def alive(self) -> bool:
        return psutil.pid_exists(self.master)

    @classmethod
    def listening_on(cls, port: int) -> Gunicorn:
        """The master of the gunicorn listening on ``port`` on this machine: the oldest
        ancestor of a listening process that listens on the port too (the system-wide
        listing names one process per socket, and the master shares its socket with every
        worker)."""
        pids = {
            c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        }
        masters = {_top_listener(pid, port) for pid in pids}
        if len(masters) != 1:
            raise ServerNotFound(
                f"no single process tree listens on port {port} (listening pids: "
                f"{sorted(pids) or 'none'}); give --gunicorn-pid, or run as the server's user"
            )
        master = masters.pop()
        if not psutil.Process(master).children():
            raise ServerNotFound(
                f"process {master} listens on port {port} but has no workers: not a gunicorn "
                "master (give --gunicorn-pid)"
            )
        return cls(master)


def client_ports(pid: int) -> frozenset[int]:
    """The remote (client) ports of a process's TCP connections to loopback clients."""
    return frozenset(
        c.raddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.status != psutil.CONN_LISTEN
    )


def _top_listener(pid: int, port: int) -> int:
    top = pid
    try:
        for ancestor in psutil.Process(pid).parents():
            if not _listens(ancestor, port):
                break
            top = ancestor.pid
    except psutil.Error:
        pass
    return top


def _listens(process: psutil.Process, port: int) -> bool:
    try:
        connections = process.net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections
    )


def _started_at(process: psutil.Process) -> float:
    try:
        return process.create_time()
    except psutil.NoSuchProcess:
        return 0.0


# ---------------------------------------------------------------------- --start-server


@dataclass
class StartedServer:
    """gunicorn started by the run; ``stop`` ends it and any worker it left behind."""

    process: subprocess.Popen[bytes]
    url: str
    admin_token: str
    repository: Path
    log: Path

    @property
    def gunicorn(self) -> Gunicorn:
        return Gunicorn(self.process.pid)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, timeout_s: float = 30) -> None:
        workers = [psutil.Process(pid) for pid in self.gunicorn.workers()]
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for worker in workers:
            if worker.is_running():
                worker.kill()


def start_gunicorn(
    repository: Path, work_dir: Path, workers: int, env: dict[str, str], timeout_s: float = 120
) -> StartedServer:
    """gunicorn with ``workers`` workers on a free loopback port, ready in every worker.

    ``repository`` is served (and written to) as it is: pass a copy. ``env`` adds RLSERVE_*
    settings (or overrides these defaults)."""
    port = _free_port()
    token = secrets.token_hex(16)
    log = work_dir / "server.log"
    full_env = {
        **os.environ,
        "RLSERVE_MODEL_REPOSITORY": str(repository),
        "RLSERVE_HOST": "127.0.0.1",
        "RLSERVE_PORT": str(port),
        "RLSERVE_WORKERS": str(workers),
        "RLSERVE_ADMIN_TOKEN": token,
        "RLSERVE_ACCESS_LOG": "false",
        "PROMETHEUS_MULTIPROC_DIR": str(work_dir / "metrics"),
        **env,
    }
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--config", str(GUNICORN_CONFIG)],
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    server = StartedServer(
        process, f"http://127.0.0.1:{port}", full_env["RLSERVE_ADMIN_TOKEN"], repository, log
    )
    try:
        _wait_ready(server, workers, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: StartedServer, workers: int, timeout_s: float) -> None:
    """/ready answers 200 and every worker says in the log that it is ready."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=server.url, timeout=2) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise ServerNotFound(
                    f"gunicorn exited with {server.process.returncode}:\n{server.log_tail()}"
                )
            ready_workers = server.log_tail(10**7).count("rlserve.phases: ready after")
            try:
                ready = client.get("/ready").status_code == 200
            except httpx.TransportError:
                ready = False
            if ready and ready_workers >= workers:
                return
            time.sleep(0.1)
    raise ServerNotFound(f"gunicorn not ready in {timeout_s:g}s:\n{server.log_tail()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
