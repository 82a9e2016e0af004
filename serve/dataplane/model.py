"""What the data plane needs of a loaded model version, whatever its kind.

Frontends call ``prepare`` on the event loop; the scheduler calls ``execute`` for a whole
batch (inline on the event loop when batches are cheap, on its thread when not) and
``respond`` to cut each request's answer from the batch's outputs (a model of rows:
``RowModel``). Each kind's version class implements what it serves: actor-critic policies
rows, language models generations, through their own scheduler; the data plane imports
neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

import numpy as np

from kernel.contract import PolicyContract
from kernel.errors import InvalidInput
from serve.dataplane.kinds import ModelKind
from serve.dataplane.messages import InferenceRequest, Prepared
from serve.execution.runtime import ProviderReport
from serve.types import Answer, Outputs

if TYPE_CHECKING:
    from serve.config import FeatureView


class ServedModel(Protocol):
    """A loaded version, whatever its kind."""

    model_kind: ClassVar[ModelKind]  # what it serves: rows or generations
    name: str
    version: int
    sha256: str
    provider: str  # the execution provider that runs it
    provider_report: ProviderReport
    features: FeatureView | None  # its own features view, over its model's (None: none)

    def warm_up(self, sizes: Sequence[int]) -> dict[int, float]:
        """Run each batch size once (first-run costs paid now); seconds per size."""
        ...

    def describe(self) -> dict[str, Any]:
        """What GET /v1/models/{model} shows about this version."""
        ...


class RowModel(ServedModel, Protocol):
    """A version whose requests are rows of one forward pass (an actor-critic policy)."""

    contract: PolicyContract

    def prepare(self, request: InferenceRequest) -> Prepared:
        """Validate one request; raises an RLServeError naming what is wrong."""
        ...

    def execute(self, inputs: dict[str, np.ndarray], requests: Sequence[Prepared]) -> Outputs:
        """Run a batch: ``inputs`` holds every request's rows in order; returns every
        output, the policy heads' included, for all rows."""
        ...

    def respond(self, request: Prepared, outputs: Outputs, start: int) -> Answer:
        """One request's answer: the outputs it asked for, from its rows ``start:``."""
        ...


def as_rows(model: ServedModel) -> RowModel:
    """A version of rows as what it is; its kind says so (a scheduler of rows is only ever
    given versions of rows: the lifecycle refuses the other kind when it loads)."""
    if model.model_kind is not ModelKind.ROWS:
        raise InvalidInput(f"model {model.name!r} is a {model.model_kind.noun}: it takes no rows")
    return cast(RowModel, model)


class VersionSource(Protocol):
    """Where a scheduler finds the version a batch runs on (``serve.control.lifecycle``)."""

    @property
    def active(self) -> int | None: ...

    def get(self, version: int) -> ServedModel | None: ...
