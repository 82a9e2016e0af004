"""The interface between the request path and a loaded model version, whatever its kind.

The routes and the batcher only use :class:`ServedModel`. Actor-critic policies
(``serve.actor_critic``) are the first kind; language-model policies will be another,
with their own ``prepare`` (tokenise) and ``run`` (generate or score).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from serve.errors import RLServeError
from serve.runtime import ProviderReport
from serve.types import Answer, Prepared


class ServedModel(Protocol):
    name: str
    version: int
    sha256: str
    provider: str  # the execution provider that runs it
    provider_report: ProviderReport

    def prepare(self, payload: Mapping[str, Any]) -> Prepared:
        """Validate one request body; raises an RLServeError naming what is wrong."""
        ...

    def run(self, batch: Sequence[Prepared], padded_rows: int) -> list[Answer | RLServeError]:
        """Execute a batch (in a worker thread); one answer or error per request, in order."""
        ...

    def warm_up(self, sizes: Sequence[int]) -> None:
        """Run each batch size once so the first real requests pay no first-run costs."""
        ...

    def describe(self) -> dict[str, Any]:
        """What GET /v1/models/{model} shows about this version."""
        ...
