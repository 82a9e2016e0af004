"""Admitted latency under load, timed by the client: a few keep-alive connections of its own.

wrk's latency histogram mixes every status, and a refusal is fast, so it says nothing about
the requests that were served. The probe is a handful of connections that behave like a
client that follows the protocol (closed loop: each sends its next request as soon as the
previous answer arrives, but after a refusal that names a Retry-After, 429 or 503, it
waits that long first, as ``rlserve collect`` and the reference guides' clients do) and
time every request from just before it is written to just after its answer is read,
keeping the times of 2xx answers. (A probe that ignored Retry-After, as wrk does, would
measure nothing once refused: the server reads a refused connection again only after the
Retry-After and judges the request it then finds as sent when the wait began, so that
request is answered 504, and so on while the overload lasts.) Its latencies are what a caller sees:
they include the time a request waits in the kernel's buffers before the server reads it,
which the server's own latency histogram (measured from the request's arrival in the
handler, whatever its status) does not.

Each connection is a thread on the load core (``cpu.LOAD_CORE``) with ``http.client``;
mostly blocked in ``recv``, they cost wrk little.
"""

from __future__ import annotations

import http.client
import math
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urlsplit

from bench import cpu


@dataclass(frozen=True)
class ProbeResult:
    connections: int
    seconds: float  # the window its requests were kept from
    answered: int  # answers of any status
    admitted_ms: tuple[float, ...]  # the latency of each 2xx answer, sorted
    failures: int  # requests lost to a connection error or a timeout (then reconnected)

    @property
    def admitted(self) -> int:
        return len(self.admitted_ms)

    def percentile_ms(self, share: float) -> float:
        """Nearest-rank percentile (``share`` 0.99 for p99) of the 2xx latencies; nan if none."""
        if not self.admitted_ms:
            return math.nan
        rank = max(1, math.ceil(share * len(self.admitted_ms)))
        return self.admitted_ms[rank - 1]

    def late(self, deadline_ms: float) -> int:
        """2xx answers the caller got after its deadline."""
        return sum(1 for ms in self.admitted_ms if ms > deadline_ms)


@dataclass
class _Tally:
    """One connection's requests: (monotonic start, milliseconds, status); status 0 failed."""

    requests: list[tuple[float, float, int]] = field(default_factory=list)


class Probe:
    """``connections`` threads posting ``body`` to ``url`` while the block runs."""

    def __init__(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        connections: int,
        timeout_s: float = 10.0,
    ) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._path = parts.path or "/"
        self._body = body
        self._headers = {"Content-Type": "application/json", **headers}
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._tallies = [_Tally() for _ in range(connections)]
        self._threads = [
            threading.Thread(target=self._loop, args=(t,), name=f"probe-{i}", daemon=True)
            for i, t in enumerate(self._tallies)
        ]

    def __enter__(self) -> Probe:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self._timeout_s + 1)

    def result(self, since: float, until: float) -> ProbeResult:
        """What the probe saw of the requests sent from ``since`` and answered by ``until``
        (``time.monotonic()`` seconds: the load's own window, not its ramp-up or end);
        call after the block."""
        kept = [
            (ms, status)
            for tally in self._tallies
            for started, ms, status in tally.requests
            if started >= since and started + ms / 1e3 <= until
        ]
        return ProbeResult(
            connections=len(self._tallies),
            seconds=until - since,
            answered=sum(1 for _, status in kept if status),
            admitted_ms=tuple(sorted(ms for ms, status in kept if 200 <= status < 300)),
            failures=sum(1 for _, status in kept if not status),
        )

    def _loop(self, tally: _Tally) -> None:
        with cpu.on_core(cpu.LOAD_CORE):
            connection = self._connect()
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    connection.request("POST", self._path, self._body, self._headers)
                    answer = connection.getresponse()
                    answer.read()
                    status = answer.status
                    wait_s = _retry_after_s(status, answer.getheader("Retry-After"))
                except (OSError, http.client.HTTPException):
                    status, wait_s = 0, 0.0
                    connection.close()
                    connection = self._connect()
                tally.requests.append((started, (time.monotonic() - started) * 1e3, status))
                if wait_s:
                    self._stop.wait(wait_s)
            connection.close()

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)


def _retry_after_s(status: int, given: str | None) -> float:
    """How long to wait before the next request: a refusal's Retry-After (429, 503) in
    seconds, else nothing."""
    if status not in (429, 503) or not given:
        return 0.0
    try:
        return max(0.0, float(given))
    except ValueError:
        return 0.0
