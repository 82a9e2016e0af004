"""A real Kafka-protocol broker for the Kafka buffer's tests: ``noida-db`` (PyPI, MIT; the
``test`` extra pins it), whose wheel vendors one binary speaking several protocols. It is
started directly (``noida-db start --data-dir DIR --only kafka --kafka-port P``), not through
the package's Python wrapper, so stopping it stops the broker itself.

What it does as a Kafka broker, as these tests found (noida-db 0.2.3):

- topics with 16 partitions, consumer groups, committed offsets, ``ListOffsets``, idempotent
  producers, zstd and lz4 batches, static membership (``group.instance.id``);
- records live in memory only: no broker-restart tests here (Redis has those);
- a metadata request naming a missing topic creates it with one partition
  (``auto.create.topics.enable``), so the buffer lists all topics instead;
- ``session.timeout.ms`` below 6000 is refused (``INVALID_SESSION_TIMEOUT``);
- a member that stops heartbeating is never expired (not after 100 s): a consumer killed
  and not restarted under its name keeps its partitions, and with dynamic membership even
  a restart cannot rejoin (the group waits for the dead member). Static membership and
  ``close`` leaving the group avoid both; tests use a fresh group or topic each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlencode

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.e2e.server import free_port

# Settle fast against the test broker: its minimum session timeout, quick heartbeats (how
# soon a running member joins a rebalance) and short client timeouts.
TEST_PARAMETERS = {
    "consumer.session.timeout.ms": "6000",
    "consumer.heartbeat.interval.ms": "200",
    "timeout_s": "5",
}


def noida_binary() -> Path:
    """The broker binary inside the ``noida-db`` wheel (``pip install noida-db``)."""
    try:
        binary = Path(str(files("noida_db").joinpath("noida-db")))
    except ModuleNotFoundError as error:
        raise RuntimeError(
            "noida-db is not installed: pip install -e '.[test]' (or pip install noida-db)"
        ) from error
    if not binary.is_file():
        raise RuntimeError(f"noida-db's broker binary is missing at {binary}: reinstall noida-db")
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)  # as the package's wrapper does
    return binary


class KafkaBroker:
    """noida-db serving only Kafka on 127.0.0.1:``port``, its data under ``directory``."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.binary = noida_binary()
        self.directory = directory
        self.port = port or free_port()
        self.log = directory / "noida-db.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, topic: str, **parameters: object) -> str:
        """``kafka://`` for ``topic`` with the test tuning, then ``parameters``."""
        query = {**TEST_PARAMETERS, **{k: str(v) for k, v in parameters.items()}}
        return f"kafka://{self.bootstrap}/{topic}?{urlencode(query)}"

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the broker and wait until it answers a metadata request."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"noida-db on port {self.port} is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            str(self.binary),
            "start",
            "--data-dir",
            str(self.directory),
            "--only",
            "kafka",
            "--kafka-port",
            str(self.port),
        ]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self._wait_ready(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the broker's own process, then SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def _wait_ready(self, timeout_s: float) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"noida-db exited with {self.process.returncode}:\n{self.output()}"
                )
            try:
                admin.list_topics(timeout=0.5)
                return
            except KafkaException:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"noida-db did not answer in {timeout_s} s:\n{self.output()}")


@contextmanager
def running_broker(directory: Path) -> Iterator[KafkaBroker]:
    """A started :class:`KafkaBroker`, stopped on exit."""
    broker = KafkaBroker(directory)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
