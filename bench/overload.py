"""Goodput under overload (issue #9): rlserve serve at its saturation point, then at 10x.

One ``rlserve serve`` process on the server core, the mlp model, one server for the whole
scenario:

1. **Saturation**: closed-loop wrk at each of ``SWEEP`` connections, the model's default
   deadline (no ``X-Request-Timeout-Ms``). Goodput is 2xx answers per second; its peak
   is the saturation goodput and ``C*`` the connections that reached it.
2. **Overload**: ``FACTOR`` x ``C*`` connections for as long, every request carrying a
   deadline (``X-Request-Timeout-Ms``) shorter than the time the server needs, at its
   peak rate, to serve one request of each connection. wrk is a closed loop that does not
   honour Retry-After: a refused request is sent again at once, so the server always holds
   ``FACTOR x C*`` requests and pays for every refusal it makes. ``PROBE_CONNECTIONS`` of
   the connections are the probe's (``bench/probe.py``), which times the 2xx answers: the
   admitted latency. The probe honours Retry-After, as a client that follows the protocol
   does.
3. **Saturation again**: ``C*`` connections as in step 1, right after the overload, so
   that a machine whose speed changed during the run shows it (the two saturation runs
   disagree) and the overload is judged against the mean of the two.

The target: overload goodput at least ``MIN_RATIO`` of the saturation goodput, with the
probe's admitted p99 within the deadline. Without ``--deadline-ms`` the deadline is
``DEADLINE_SHARE`` of that serving time, so the run is an overload whatever the machine's
speed; a deadline the server could meet by serving everyone in turn makes the run no
overload, and the target is then not judged.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench import load, scenarios, servers
from bench.load import LoadResult, Statuses
from bench.probe import Probe, ProbeResult
from bench.servers import Server

MODEL = "mlp"
SWEEP = (8, 16, 32, 64)  # saturation connections
FACTOR = 10  # overload connections: FACTOR x the connections of peak goodput
PROBE_CONNECTIONS = 8  # of the overload connections, timed by the probe
DEADLINE_SHARE = 0.8  # default deadline: this share of the time to serve the overload's queue
MIN_RATIO = 0.8  # the target: overload goodput / saturation goodput
NOISY = 0.10  # saturation before and after the overload further apart: say so
PROBE_RAMP_S = 0.5  # the probe's requests count from this long after wrk starts connecting
WRK_TIMEOUT_S = 10  # answers slower than this are wrk socket timeouts (its default is 2 s)


@dataclass(frozen=True)
class GoodputRun:
    """One measured wrk run of the scenario, answers counted by status."""

    connections: int  # wrk's and the probe's
    deadline_ms: float | None  # what requests carried; None: the model's default
    load: LoadResult
    statuses: Statuses
    server_cpu_s: float  # CPU seconds of the server process during the run
    probe: ProbeResult | None = None

    @property
    def goodput(self) -> float:
        """2xx answers per second, wrk's and the probe's."""
        return _rate(self.statuses.ok, self.load.seconds) + (
            _rate(self.probe.admitted, self.probe.seconds) if self.probe else 0.0
        )

    @property
    def answers_per_s(self) -> float:
        """Answers of any status per second, wrk's and the probe's."""
        return _rate(self.load.requests, self.load.seconds) + (
            _rate(self.probe.answered, self.probe.seconds) if self.probe else 0.0
        )

    @property
    def cpu_us_per_answer(self) -> float:
        answers = self.answers_per_s * self.load.seconds
        return self.server_cpu_s * 1e6 / answers if answers else 0.0

    @property
    def errors(self) -> int:
        """Socket errors and statuses other than 2xx, 429, 503 and 504."""
        return self.load.socket_errors + self.statuses.other


@dataclass(frozen=True)
class OverloadRun:
    sweep: tuple[GoodputRun, ...]
    overload: GoodputRun
    after: GoodputRun  # C* connections again, right after the overload
    deadline_ms: float
    deadline_given: bool  # --deadline-ms; else DEADLINE_SHARE of the queue's serving time

    @property
    def saturation(self) -> GoodputRun:
        """The sweep's run of peak goodput: C* is its connections."""
        return max(self.sweep, key=lambda run: run.goodput)

    @property
    def saturation_goodput(self) -> float:
        """What the overload is judged against: the mean of the saturation goodput before
        and after it."""
        return (self.saturation.goodput + self.after.goodput) / 2

    @property
    def drift(self) -> float:
        """Saturation goodput after the overload against before it, minus 1: how much the
        machine's speed changed during the run."""
        before = self.saturation.goodput
        return self.after.goodput / before - 1 if before else math.inf

    @property
    def ratio(self) -> float:
        peak = self.saturation_goodput
        return self.overload.goodput / peak if peak else 0.0

    @property
    def queue_ms(self) -> float:
        """How long the server, at its peak goodput (before the overload: what the default
        deadline is taken from), takes to serve one request of each overload connection:
        above the deadline, the run is an overload."""
        peak = self.saturation.goodput
        return self.overload.connections / peak * 1e3 if peak else math.inf

    @property
    def admitted_p99_ms(self) -> float:
        probe = self.overload.probe
        return math.nan if probe is None else probe.percentile_ms(0.99)


def run(
    model: Path, workdir: Path, seconds: int, warmup: int, deadline_ms: float | None
) -> OverloadRun:
    """The scenario against ``rlserve serve`` serving the mlp model folder ``model``."""
    server = servers.start(servers.SERVE, model, workdir)
    _say(f"  overload: rlserve serve, pid {server.process.pid}")
    try:
        return _run(server, seconds, warmup, deadline_ms)
    finally:
        server.stop()


def _run(server: Server, seconds: int, warmup: int, deadline_ms: float | None) -> OverloadRun:
    url = f"{server.url}/predict"
    body = orjson.dumps({"observations": scenarios.observation(MODEL)})
    load.post(url, body, SWEEP[-1], warmup)
    sweep = tuple(_measure(server, url, body, c, seconds, None) for c in SWEEP)
    peak = max(sweep, key=lambda r: r.goodput)
    if peak.goodput == 0:
        raise RuntimeError(f"no 2xx answer at any of {SWEEP} connections:\n{server.log_tail()}")
    connections = FACTOR * peak.connections
    given = deadline_ms is not None
    if deadline_ms is None:
        deadline_ms = max(1.0, math.floor(DEADLINE_SHARE * connections / peak.goodput * 1e3))
    _say(
        f"  overload: saturation {peak.goodput:,.0f} 2xx/s at {peak.connections} connections; "
        f"{connections} connections, deadline {deadline_ms:g} ms"
    )
    headers = {"X-Request-Timeout-Ms": f"{deadline_ms:g}"}
    load.post(url, body, connections, warmup, headers=headers, timeout_s=WRK_TIMEOUT_S)
    overload = _measure(server, url, body, connections, seconds, deadline_ms, probe=True)
    after = _measure(server, url, body, peak.connections, seconds, None)
    return OverloadRun(sweep, overload, after, deadline_ms, given)


def _measure(
    server: Server,
    url: str,
    body: bytes,
    connections: int,
    seconds: int,
    deadline_ms: float | None,
    *,
    probe: bool = False,
) -> GoodputRun:
    headers = {} if deadline_ms is None else {"X-Request-Timeout-Ms": f"{deadline_ms:g}"}
    probed = PROBE_CONNECTIONS if probe else 0
    _say(f"  overload: {connections} connections" + (f" ({probed} probe)" if probe else ""))
    with Probe(url, body, headers, probed, timeout_s=WRK_TIMEOUT_S) as prober:
        before, started = server.cpu_seconds(), time.monotonic()
        result = load.post(
            url, body, connections - probed, seconds,
            headers=headers, count_statuses=True, timeout_s=WRK_TIMEOUT_S,
        )  # fmt: skip
        spent, ended = server.cpu_seconds() - before, time.monotonic()
    assert result.statuses is not None  # counted
    seen = prober.result(started + PROBE_RAMP_S, ended) if probe else None
    return GoodputRun(connections, deadline_ms, result, result.statuses, spent, seen)


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
