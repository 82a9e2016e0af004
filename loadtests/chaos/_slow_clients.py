"""Slow clients: connections that idle, and requests whose body arrives a byte at a time.

Each client is a thread with a plain socket (the server must not care how slowly a client
writes, and must keep answering everybody else meanwhile):

- an **idle** client connects and sends nothing for the fault's duration, then closes;
  what it observes is whether (and when) the server closed the connection;
- a **trickling** client sends a predict request's headers at once and its body in small
  pieces spread over a while (from a fifth of the request deadline to twice it), then reads
  the answer. Its request is accounted like every other (2xx, or a 504 when its deadline
  passed while the body was arriving; no answer at all is a lost request).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from loadtests.chaos._records import RequestRecord, Source, Stage

PIECES = 20


@dataclass
class IdleOutcome:
    closed_by_server_after_s: float | None = None  # None: still open when the client left


@dataclass
class SlowClients:
    """Start with ``start``; ``join`` waits for every client and returns what they saw."""

    url: str
    path: str
    body: bytes
    deadline_ms: float
    idle: int
    trickling: int
    hold_s: float
    headers: dict[str, str] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    idle_outcomes: list[IdleOutcome] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        parts = urlsplit(self.url)
        address = (parts.hostname or "127.0.0.1", parts.port or 80)
        for _ in range(self.idle):
            self._spawn(self._idle, address)
        for i in range(self.trickling):
            share = i / max(self.trickling - 1, 1)
            trickle_s = self.deadline_ms / 1000 * (0.2 + 1.8 * share)
            self._spawn(self._trickle, address, trickle_s)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _idle(self, address: tuple[str, int]) -> None:
        outcome = IdleOutcome()
        started = time.monotonic()
        try:
            with socket.create_connection(address, timeout=5) as sock:
                sock.settimeout(self.hold_s)
                try:
                    if sock.recv(1) == b"":
                        outcome.closed_by_server_after_s = time.monotonic() - started
                except TimeoutError:
                    pass  # still open: what an idle client may expect within keep-alive
                except OSError:
                    outcome.closed_by_server_after_s = time.monotonic() - started
        except OSError:
            outcome.closed_by_server_after_s = 0.0
        with self._lock:
            self.idle_outcomes.append(outcome)

    def _trickle(self, address: tuple[str, int], trickle_s: float) -> None:
        record = RequestRecord(Source.SLOW, time.monotonic(), 0.0)
        stage = Stage.CONNECT
        try:
            with socket.create_connection(address, timeout=5) as sock:
                record.port = sock.getsockname()[1]
                sock.settimeout(trickle_s + 10)
                stage = Stage.SEND
                sock.sendall(self._head())
                piece = max(1, len(self.body) // PIECES + 1)
                for offset in range(0, len(self.body), piece):
                    time.sleep(trickle_s / PIECES)
                    sock.sendall(self.body[offset : offset + piece])
                stage = Stage.RECEIVE
                response = http.client.HTTPResponse(sock)
                response.begin()
                data = response.read()
                record.status = response.status
                if 200 <= response.status < 300:
                    record.version = int(response.getheader("x-policy-version") or 0)
                else:
                    record.body = data[:300].decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            record.stage, record.error = stage, f"{type(exc).__name__}: {exc}"[:200]
        record.ended = time.monotonic()
        with self._lock:
            self.records.append(record)

    def _head(self) -> bytes:
        parts = urlsplit(self.url)
        lines = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Content-Type: application/json",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.headers.items()),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
