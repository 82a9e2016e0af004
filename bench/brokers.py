"""The buffer servers of the ``loop`` scenario, started by the benchmark on the server core:
``redis-server`` (Debian package ``redis-server``; ``make test`` installs it) with
``appendonly yes`` and ``appendfsync everysec``, and ``noida-db`` (PyPI, in the test
extra), a small Kafka-protocol broker whose wheel vendors its binary; that binary is
started directly (``start --data-dir DIR --only kafka --kafka-port P``), so stopping it
stops the broker itself, not a Python wrapper.

Each starter returns a :class:`Broker` once the server answers, or raises
:class:`Unavailable` saying why it could not start (the scenario records that and goes on).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

from bench import cpu, servers


class Unavailable(RuntimeError):
    """The buffer server could not be started here; the message says why."""


class Broker:
    """A server process on 127.0.0.1:``port``, its output in ``log``."""

    def __init__(self, name: str, command: list[str], port: int, log: Path) -> None:
        self.name, self.port, self.log = name, port, log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                cpu.pinned(command, cpu.SERVER_CORE), stdout=out, stderr=subprocess.STDOUT
            )

    def wait(self, ready: Callable[[], bool], timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Unavailable(
                    f"{self.name} exited with {self.process.returncode}: {self.tail()}"
                )
            if ready():
                return
            time.sleep(0.05)
        self.stop()
        raise Unavailable(f"{self.name} did not answer within {timeout_s:g} s: {self.tail()}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return " ".join(text.split()[-60:]) or "(no output)"


AOF_EVERY_SECOND = ("--appendonly", "yes", "--appendfsync", "everysec")


def redis(
    directory: Path, *, options: tuple[str, ...] = AOF_EVERY_SECOND, core: int | None = None
) -> Broker:
    """``redis-server`` on a free loopback port, no RDB snapshots, with ``options`` (by
    default AOF persistence, fsync every second), on ``core`` when one is given (a Broker
    otherwise runs on the server's core)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise Unavailable("redis-server is not on PATH (apt-get install redis-server; make test)")
    directory.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    command = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
        *options, "--save", "", "--daemonize", "no", "--logfile", "",
    ]  # fmt: skip
    broker = Broker("redis-server", cpu.pinned(command, core), port, directory / "redis.log")
    broker.wait(lambda: _redis_ping(port))
    return broker


def redis_version() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        return ""
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    words = done.stdout.split()
    version = next((w[2:] for w in words if w.startswith("v=")), "")
    return f"redis-server {version}".strip()


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def noida(directory: Path) -> Broker:
    """noida-db's vendored binary serving only Kafka."""
    binary = noida_binary()
    directory.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    command = [
        str(binary), "start", "--data-dir", str(directory), "--only", "kafka",
        "--kafka-port", str(port),
    ]  # fmt: skip
    broker = Broker("noida-db", command, port, directory / "noida-db.log")
    broker.wait(lambda: _kafka_answers(port))
    return broker


def noida_binary() -> Path:
    """The broker binary inside the ``noida-db`` wheel."""
    try:
        binary = Path(str(files("noida_db").joinpath("noida-db")))
    except ModuleNotFoundError as error:
        raise Unavailable("noida-db is not installed (pip install -e '.[test]')") from error
    if not binary.is_file():
        raise Unavailable(f"noida-db's broker binary is missing at {binary}: reinstall noida-db")
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)  # as the package's wrapper does
    return binary


def noida_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(PackageNotFoundError):
        return f"noida-db {version('noida-db')}"
    return ""


def _kafka_answers(port: int) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    try:
        admin.list_topics(timeout=0.5)
    except KafkaException:
        return False
    return True
