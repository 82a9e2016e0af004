"""Load on an rlserve server the way RL clients make it: ``locust -f loadtests/ --host URL``.

Two users, both on the model given by ``--model`` (default: the server's first model):

- ``RLActorUser``: an actor stepping one environment, one observation per request;
- ``VectorEnvUser``: an actor stepping a vectorised environment, ``--batch-rows``
  observations per request.

Observations are drawn from the model's policy contract. Pacing is a closed loop with
``--think-time-ms`` or an open loop with ``--rate-per-user`` (``_pace``). When locust quits,
the P99 and failure-ratio gates decide the exit code (``_gates``). See docs/loadtests.md.
"""

from __future__ import annotations

import itertools
from typing import Any

from locust import FastHttpUser, task

import _gates  # noqa: F401  (registers the gates)
from _options import LoadOptions
from _pace import Pace
from _traffic import traffic_for

JSON = {"Content-Type": "application/json"}


class PolicyUser(FastHttpUser):
    """One client of the policy: the same request, over and over, at the chosen pace."""

    abstract = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pace = Pace(LoadOptions.of(self.environment))

    def rows(self, options: LoadOptions) -> int | None:
        """Observations per request; None sends one observation, not a list of one."""
        raise NotImplementedError

    def on_start(self) -> None:
        options = LoadOptions.of(self.environment)
        rows = self.rows(options)
        traffic = traffic_for(self.host, options.model, options.deterministic, rows)
        self.path = traffic.path
        self.label = f"predict {traffic.model} x{rows or 1}"
        self.bodies = itertools.cycle(traffic.bodies)

    def wait_time(self) -> float:
        return self.pace.wait(self)

    @task
    def predict(self) -> None:
        self.client.post(self.path, data=next(self.bodies), headers=JSON, name=self.label)
        self.pace.count()

    def on_stop(self) -> None:
        self.pace.stop()


class RLActorUser(PolicyUser):
    """An actor stepping one environment: one observation per request."""

    def rows(self, options: LoadOptions) -> int | None:
        return None


class VectorEnvUser(PolicyUser):
    """An actor stepping a vectorised environment: --batch-rows observations per request."""

    def rows(self, options: LoadOptions) -> int | None:
        return options.batch_rows
