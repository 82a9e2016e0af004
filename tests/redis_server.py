"""A real ``redis-server`` (Debian package ``redis-server``; ``make test`` installs it) on a
free loopback port with its own directory, for the tests of what talks to Redis: the Redis
Streams experience buffer (``tests/loop``) and the result cache (``tests/e2e``,
``tests/serve/dataplane``).

Persistence is on by default (``appendonly yes``, ``appendfsync always``, no RDB snapshots),
so a server stopped, even with SIGKILL, and started again on the same directory has every
write it acknowledged; ``persistent=False`` keeps everything in memory (a cache). ``options``
are more ``redis-server`` arguments (``["--maxmemory", "1mb"]``).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.server import free_port


class RedisServer:
    """``redis-server`` in the foreground on 127.0.0.1; ``start``, ``stop``, ``kill`` and
    ``restart`` keep the port and the directory."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        *,
        persistent: bool = True,
        options: Sequence[str] = (),
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: apt-get install -y redis-server (make test "
                "does this)"
            )
        self.binary = binary
        self.directory = directory
        self.port = port or free_port()
        self.persistent = persistent
        self.options = list(options)
        self.log = directory / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, stream: str, **parameters: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"stream": stream, **parameters}.items())
        return f"redis://127.0.0.1:{self.port}/0?{query}"

    def address(self, db: int = 0) -> str:
        """``redis://127.0.0.1:<port>/<db>``."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the server and wait until it answers PING (after loading its AOF)."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            *(["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else []),
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.options,
        ]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self._wait_ready(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (Redis flushes its AOF and exits) and wait."""
        self._signal(signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        """SIGKILL: a crash. With ``appendfsync always`` nothing acknowledged is lost."""
        self._signal(signal.SIGKILL, 10.0)

    def restart(self, *, crash: bool = False) -> None:
        self.kill() if crash else self.stop()
        self.start()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def _signal(self, signum: signal.Signals, timeout_s: float) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self.process.returncode}:\n{self.output()}"
                )
            if self._ping():
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer PING in {timeout_s} s:\n{self.output()}")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")  # -LOADING while reading its AOF
        except OSError:
            return False


@contextmanager
def running_redis(
    directory: Path, *, persistent: bool = True, options: Sequence[str] = ()
) -> Iterator[RedisServer]:
    """A started :class:`RedisServer`, stopped on exit."""
    server = RedisServer(directory, persistent=persistent, options=options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
