"""A real rlserve server in a subprocess on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

RLSERVE = [sys.executable, "-m", "cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server command started on a free port; stopped by ``stop``.

    The port reaches the command as RLSERVE_PORT, and as any argument spelled ``{port}``.
    """

    def __init__(self, args: list[str], env: dict[str, str] | None = None, log: Path | None = None):
        self.port = free_port()
        args = [a.replace("{port}", str(self.port)) for a in args]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        full_env = {
            **os.environ,
            "RLSERVE_PORT": str(self.port),
            "RLSERVE_HOST": "127.0.0.1",
            **(env or {}),
        }
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed in stop()
        self._out = out
        self.process = subprocess.Popen(args, env=full_env, stdout=out, stderr=subprocess.STDOUT)
        # A test or fixture that fails before its stop() (a server never ready, say) must not
        # leave the server running past the test session.
        atexit.register(self._kill_if_running)

    @classmethod
    def rlserve(
        cls,
        repository: Path,
        *flags: str,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> Server:
        return cls([*RLSERVE, "serve", "--model-repository", str(repository), *flags], env, log)

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10, **kwargs)  # type: ignore[arg-type]

    def wait_listening(self, timeout_s: float = 30) -> None:
        self.wait_until(lambda c: c.get("/health").status_code == 200, timeout_s, "listening")

    def wait_ready(self, timeout_s: float = 60) -> None:
        self.wait_until(lambda c: c.get("/ready").status_code == 200, timeout_s, "ready")

    def wait_until(
        self, check: Callable[[httpx.Client], bool], timeout_s: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=2) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"server exited with {self.process.returncode}: {self.output()}"
                    )
                try:
                    if check(client):
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.02)
        raise TimeoutError(f"server not {what} after {timeout_s}s: {self.output()}")

    def send_signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self._out is not subprocess.DEVNULL:
            self._out.close()  # type: ignore[union-attr]
        return code

    def _kill_if_running(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def output(self, full: bool = False) -> str:
        """The server's log (its tail unless ``full``)."""
        text = self.log.read_text() if self.log and self.log.exists() else ""
        return text if full else text[-4000:]

    def metric(self, client: httpx.Client, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include ``labels``."""
        total = 0.0
        for line in client.get("/metrics").text.splitlines():
            named = line.startswith((name + "{", name + " "))
            if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total
