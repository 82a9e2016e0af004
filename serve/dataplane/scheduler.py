"""The scheduler interface: what a model's lifecycle and the frontends need of a scheduler.

A scheduler owns a model's queue and decides when and how its requests run. This is what
every scheduler offers; how requests are handed to one is its kind's own: the dynamic
batch scheduler (``serve.batching.dynamic_batcher``), for policies whose requests are
rows of one forward pass, takes them with ``submit``; the continuous-batching scheduler
(``serve.lm.scheduling.scheduler``), for language models, with ``submit_generation`` and
``submit_scoring``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kernel.errors import InvalidInput
from serve.dataplane.messages import InferenceResponse, Prepared

# Why a request whose deadline passed before it ran is answered 504, whichever scheduler.
NOT_RUN = "deadline passed while queued; the request was not run"


def runs_no_rows(model: str) -> InvalidInput:
    """What a call of rows (observations, tensors) gets from a language model's scheduler,
    which takes generations and scorings only."""
    return InvalidInput(
        f"model {model!r} is a language model: POST /v1/models/{model}/generate "
        "or /score; it takes no observations"
    )


if TYPE_CHECKING:
    from serve.batching.record import RecordSink


class Scheduler(Protocol):
    name: str

    @property
    def held(self) -> bool:
        """Held: it runs nothing until ``resume``."""
        ...

    def start(self) -> None:
        """Bind to the running event loop; called once before the first request."""
        ...

    def admit(self, rows: int, deadline: float) -> None:
        """Raise what queueing ``rows`` rows now would raise (QueueFull: back-pressure;
        ServiceUnavailable: stopping), without queueing: a frontend asks before it spends
        time decoding a request that will be refused."""
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


class RowScheduler(Scheduler, Protocol):
    """A scheduler of rows (``serve.batching.dynamic_batcher``): requests of one forward
    pass, validated by the version they were routed to."""

    @property
    def max_batch_size(self) -> int:
        """The most rows one batch of this model runs."""
        ...

    @property
    def sinks(self) -> Sequence[RecordSink]:
        """Where the records of its batches go (in order: the metrics first); a batch of
        the model run elsewhere (the lane's serving thread) publishes there too."""
        ...

    def submit(self, prepared: Prepared, version: int | None) -> asyncio.Future[InferenceResponse]:
        """Queue a validated request; its future settles with the answer or an RLServeError.

        ``version`` pins the request to one version; None runs it on whichever version is
        active when its batch forms. Raises QueueFull (back-pressure) or
        ServiceUnavailable (stopping) at once instead of queueing. A request of more rows
        than a batch holds is split across batches, on one version.
        """
        ...


@dataclass(frozen=True, slots=True)
class Load:
    """A scheduler's load at one moment."""

    queued_rows: int  # rows waiting for a batch
    pending_rows: int  # rows waiting or running
    requests: int  # requests admitted and not yet answered
