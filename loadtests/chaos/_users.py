"""The chaos run's locustfile: ``python -m loadtests.chaos`` starts locust on it.

Three users, on the model and at the pace of the run's :class:`~loadtests.chaos._plan.LoadPlan`:

- ``ActorUser``: one observation per request (an actor stepping one environment);
- ``VectorEnvUser``: ``batch_rows`` observations per request (a vectorised environment);
- ``BurstUser``: idle until the run turns the burst on, then ``batch_rows`` observations
  back to back, on connections of its own that it closes when the burst ends.

Bodies come from ``loadtests/_traffic.py``, drawn from the served model's policy contract.
Every user holds one keep-alive connection and never retries: each request ends as one
:class:`~loadtests.chaos._records.RequestRecord`, with the client's local port, so that the
accounting can tell which connection (and so which gunicorn worker) a failure was on.
locust's own statistics get every request too (a non-2xx answer as a failure).
"""

from __future__ import annotations

import http.client
import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from locust import User, constant, events, task

from loadtests._traffic import traffic_for
from loadtests.chaos._plan import PLAN_ENV, LoadPlan
from loadtests.chaos._records import RequestRecord, Source, Stage, write_records

PLAN = LoadPlan.load(Path(os.environ[PLAN_ENV]))
CONTROL = PLAN.control
POLL_S = 0.02
BODY_EXCERPT = 300


@dataclass
class Switches:
    """What the run asks for, as last read from the control folder."""

    burst: bool = False
    stop: bool = False
    in_flight: int = 0


SWITCHES = Switches()
RECORDS: list[RequestRecord] = []


class Refused(Exception):
    """A non-2xx answer, as locust's statistics show it."""


class Sender:
    """One keep-alive HTTP/1.1 connection; after a failure the next request opens another."""

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout_s = timeout_s
        self.headers = headers
        self.connection: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes, source: Source) -> RequestRecord:
        record = RequestRecord(source, time.monotonic(), 0.0)
        stage = Stage.CONNECT
        try:
            connection = self._connection()
            record.port = connection.sock.getsockname()[1]
            stage = Stage.SEND
            connection.request("POST", path, body, self.headers)
            stage = Stage.RECEIVE
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            record.stage, record.error = stage, f"{type(exc).__name__}: {exc}"[:200]
            self.close()
        else:
            record.status = response.status
            if 200 <= response.status < 300:
                record.version = int(response.getheader("x-policy-version") or 0)
            else:
                record.body = data[:BODY_EXCERPT].decode("utf-8", "replace")
            if response.will_close:
                self.close()
        record.ended = time.monotonic()
        return record

    def _connection(self) -> http.client.HTTPConnection:
        if self.connection is None:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            connection.connect()
            self.connection = connection
        return self.connection

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


class ChaosUser(User):
    abstract = True
    source = Source.STEADY
    rows: int | None = None  # None: one observation, not a list of one

    def on_start(self) -> None:
        traffic = traffic_for(PLAN.host, PLAN.model, PLAN.deterministic, self.rows)
        self.path = traffic.path
        self.bodies = itertools.cycle(traffic.bodies)
        self.label = f"{self.source.value} predict {traffic.model} x{self.rows or 1}"
        headers = {"Content-Type": "application/json"}
        if PLAN.deadline_ms is not None:
            headers["X-Request-Timeout-Ms"] = f"{PLAN.deadline_ms:g}"
        self.sender = Sender(PLAN.host, PLAN.timeout_s, headers)

    def send(self) -> None:
        SWITCHES.in_flight += 1
        try:
            record = self.sender.post(self.path, next(self.bodies), self.source)
        finally:
            SWITCHES.in_flight -= 1
        RECORDS.append(record)
        failure: Exception | None = None
        if record.status == 0:
            failure = ConnectionError(record.error)
        elif not 200 <= record.status < 300:
            failure = Refused(f"HTTP {record.status}")
        self.environment.events.request.fire(
            request_type="POST",
            name=self.label,
            response_time=record.latency_ms,
            response_length=0,
            exception=failure,
            context={},
        )

    def on_stop(self) -> None:
        self.sender.close()


class ActorUser(ChaosUser):
    fixed_count = PLAN.actor_users
    wait_time = constant(PLAN.think_time_s)

    @task
    def step(self) -> None:
        if SWITCHES.stop:
            time.sleep(POLL_S)
        else:
            self.send()


class VectorEnvUser(ActorUser):
    fixed_count = PLAN.vector_users
    rows = PLAN.batch_rows


class BurstUser(ChaosUser):
    fixed_count = PLAN.burst_users
    source = Source.BURST
    rows = PLAN.batch_rows
    wait_time = constant(0)

    @task
    def burst(self) -> None:
        if SWITCHES.burst and not SWITCHES.stop:
            self.send()
        else:
            self.sender.close()  # the burst's connections go with it
            time.sleep(POLL_S)


@events.test_start.add_listener
def _follow_the_run(environment: Any, **_: Any) -> None:
    # locust has monkey-patched the standard library: this thread is a greenlet, and
    # time.sleep yields to the users.
    threading.Thread(target=_control, daemon=True).start()


def _control() -> None:
    """Reads the flags until ``stop``; then, once no request is in flight, the records."""
    announced = False
    while not CONTROL.stop.exists():
        SWITCHES.burst = CONTROL.burst.exists()
        if RECORDS and not announced:
            CONTROL.running.touch()
            announced = True
        time.sleep(POLL_S)
    SWITCHES.stop, SWITCHES.burst = True, False
    deadline = time.monotonic() + PLAN.timeout_s + 1
    while SWITCHES.in_flight and time.monotonic() < deadline:
        time.sleep(POLL_S)
    write_records(CONTROL.records, RECORDS)
