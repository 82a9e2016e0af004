"""How long a user waits between requests: a closed loop (think time) or an open one (rate).

Closed loop (the default): a user sends, waits for the answer, pauses ``--think-time-ms`` and
sends again. When the server slows down, the users send less, so the slow moments get few
samples and the tail latency is under-reported (coordinated omission).

Open loop, ``--rate-per-user R``: locust's ``constant_throughput(R)`` schedules a request every
1/R s whatever the answer time. A locust user still waits for its answer, though, so it can
never go faster than one request per response time: when the server cannot keep up, the rate
falls short of R. At the end of the run every process that ran users says which it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from locust import constant, constant_throughput, events

from _options import LoadOptions

_started: list[Pace] = []


class Pace:
    def __init__(self, options: LoadOptions) -> None:
        self.target_rate = options.rate_per_user
        self.wait: Callable[[Any], float] = (
            constant_throughput(options.rate_per_user)
            if options.rate_per_user > 0
            else constant(options.think_time_s)
        )
        self.started: float | None = None  # at the first request
        self.stopped: float | None = None
        self.requests = 0
        _started.append(self)

    def count(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()
        self.requests += 1

    def stop(self) -> None:
        self.stopped = time.perf_counter()

    def achieved_rate(self, now: float) -> float:
        elapsed = (self.stopped or now) - (self.started or now)
        return self.requests / elapsed if elapsed > 0 else 0.0


@events.test_start.add_listener
def _forget_earlier_runs(environment: Any, **_: Any) -> None:
    _started.clear()  # the web UI may start several runs in one process


@events.quitting.add_listener
def _report_open_loop_rate(environment: Any, **_: Any) -> None:
    open_loop = [p for p in _started if p.target_rate > 0]
    if open_loop:
        print(rate_report(open_loop, time.perf_counter()), flush=True)


def rate_report(paces: list[Pace], now: float) -> str:
    target = paces[0].target_rate
    rates = [p.achieved_rate(now) for p in paces]
    mean = sum(rates) / len(rates)
    line = (
        f"open loop: target {target:g} req/s per user, achieved {mean:.2f} "
        f"(slowest user {min(rates):.2f}) over {len(rates)} users"
    )
    if mean < 0.95 * target:
        line += (
            " -- TARGET RATE NOT REACHED: each user waits for its answer, so the server's "
            "latency capped the rate; add users or lower --rate-per-user"
        )
    return line
