"""The scheduler interface: what a model's lifecycle and the frontends need of a scheduler.

A scheduler owns a model's queue and decides when and how its requests run. The dynamic
batch scheduler (``serve.dataplane.dynamic_batcher``) is the first implementation, for
policies whose requests are one forward pass; a continuous-batching scheduler for
language-model generation slots in beside it behind the same interface.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from serve.dataplane.messages import InferenceResponse, Prepared

# Why a request whose deadline passed before it ran is answered 504, whichever scheduler.
NOT_RUN = "deadline passed while queued; the request was not run"


class Scheduler(Protocol):
    name: str

    @property
    def held(self) -> bool:
        """Held: it runs nothing until ``resume``."""
        ...

    def start(self) -> None:
        """Bind to the running event loop; called once before the first submit."""
        ...

    def submit(self, prepared: Prepared, version: int | None) -> asyncio.Future[InferenceResponse]:
        """Queue a validated request; its future settles with the answer or an RLServeError.

        ``version`` pins the request to one version; None runs it on whichever version is
        active when its batch forms. Raises QueueFull (back-pressure) or
        ServiceUnavailable (stopping) at once instead of queueing. A request of more rows
        than a batch holds is split across batches, on one version.
        """
        ...

    def admit(self, rows: int, deadline: float) -> None:
        """Raise what ``submit`` would raise for ``rows`` rows now, without queueing: a
        frontend asks before it spends time decoding a request that will be refused."""
        ...

    def would_admit(self, rows: int, deadline: float) -> bool:
        """Whether ``admit`` would let ``rows`` rows in now (no error is built)."""
        ...

    def hold(self) -> None:
        """Run nothing until ``resume``; queued requests wait within their deadlines."""
        ...

    def resume(self) -> None: ...

    def pin_queued(self, version: int) -> None:
        """Requests already queued without a version stay on ``version`` (a draining swap)."""
        ...

    def pinned_versions(self) -> set[int]:
        """Versions that queued requests are pinned to: they must stay loaded."""
        ...

    def stuck_for(self, now: float) -> float:
        """Seconds the running batch has been running (0 when idle)."""
        ...

    @property
    def alive(self) -> bool:
        """False once stopped."""
        ...

    def describe(self) -> dict[str, Any]:
        """The scheduler's configuration and state, for GET /v1/models/{model}."""
        ...

    def load(self) -> Load:
        """What is queued and running now (sampled for the metrics, never per request)."""
        ...

    async def stop(self) -> None:
        """Refuse new requests, answer every queued one (run, or 504 past its deadline)."""
        ...


@dataclass(frozen=True, slots=True)
class Load:
    """A scheduler's load at one moment."""

    queued_rows: int  # rows waiting for a batch
    pending_rows: int  # rows waiting or running
    requests: int  # requests admitted and not yet answered
