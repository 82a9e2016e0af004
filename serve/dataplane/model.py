"""The interface between the request path and a loaded model version, whatever its kind.

The routes and the batcher only use :class:`ServedModel`. ``execute`` runs on the batch
thread and should spend its time outside the GIL (onnxruntime releases it); everything
else runs on the event loop, so the two threads rarely wait for each other. Actor-critic policies
(``serve.policies.actor_critic``) are the first kind; language-model policies will be another,
with their own ``prepare`` (tokenise) and ``run`` (generate or score).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from serve.contract import PolicyContract
from serve.dataplane.runtime import ProviderReport
from serve.errors import RLServeError
from serve.types import Answer, Outputs, Prepared


class ServedModel(Protocol):
    name: str
    version: int
    sha256: str
    provider: str  # the execution provider that runs it
    provider_report: ProviderReport
    contract: PolicyContract

    def prepare(self, payload: Mapping[str, Any]) -> Prepared:
        """Validate one request body; raises an RLServeError naming what is wrong."""
        ...

    def execute(self, batch: Sequence[Prepared], padded_rows: int) -> Outputs:
        """Run a batch (on the batch thread): the model's raw outputs for all its rows."""
        ...

    def answer(self, batch: Sequence[Prepared], outputs: Outputs) -> list[Answer | RLServeError]:
        """Split a batch's outputs into one answer per request, in order (on the event loop)."""
        ...

    def warm_up(self, sizes: Sequence[int]) -> None:
        """Run each batch size once so the first real requests pay no first-run costs."""
        ...

    def describe(self) -> dict[str, Any]:
        """What GET /v1/models/{model} shows about this version."""
        ...
