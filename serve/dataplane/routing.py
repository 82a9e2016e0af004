"""Where a request goes: the lookup the frontends need, implemented by the control plane
(``serve.control.manager``), so the data plane never imports it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, cast

from serve.dataplane.kinds import ModelKind
from serve.dataplane.model import RowModel, ServedModel
from serve.dataplane.scheduler import RowScheduler, Scheduler, runs_no_rows

if TYPE_CHECKING:
    from serve.batching.sequences import SequenceTable
    from serve.config import FeatureView
    from serve.stores.result_cache import CacheSettings


@dataclass(frozen=True, slots=True)
class Route:
    """A model's scheduler, the version that validates the request, the version it is
    pinned to (None: whichever is active when its batch forms), its default deadline, its
    result cache (None: it has none; ``serve.stores.result_cache``), and the sequences
    whose memory it holds (None: a language model; ``serve.batching.sequences``)."""

    model: str
    kind: ModelKind  # what the model serves, decided when it was planned
    scheduler: Scheduler
    version: ServedModel
    pinned: int | None
    default_deadline_ms: float
    result_cache: CacheSettings | None = None
    sequences: SequenceTable | None = None
    features: FeatureView | None = None  # observations by entity (serve.stores.features)
    by_episode: bool = False  # the model has a canary: the call's episode chose the version

    def by_entity(self) -> Route:
        """The route of a request whose observations the features view built: a version
        with a view of its own (``features.yaml``) runs them itself, as they mean what its
        view made them mean; a model's view's rows go wherever the model's rows go."""
        if self.pinned is not None or self.row_model().features is None:
            return self
        return replace(self, pinned=self.version.version)

    def row_scheduler(self) -> RowScheduler:
        """The scheduler that takes this route's rows; a language model's refuses them."""
        if self.kind is not ModelKind.ROWS:
            raise runs_no_rows(self.model)
        return cast(RowScheduler, self.scheduler)  # the kind decided its scheduler

    def row_model(self) -> RowModel:
        """The version that validates this route's rows; a language model's refuses them."""
        if self.kind is not ModelKind.ROWS:
            raise runs_no_rows(self.model)
        return cast(RowModel, self.version)  # the kind decided its versions


class Router(Protocol):
    def resolve(self, model: str | None, version: int | None, episode: str | None = None) -> Route:
        """The route for a model (None: the default model) and version (None: the active
        one, or while the model has a canary the side ``episode`` is assigned to, an
        episode or client key the call named); raises NotFound or ServiceUnavailable."""
        ...

    def kind_of(self, model: str | None) -> ModelKind | None:
        """The kind of a model (None: the default model); None when there is no such model."""
        ...
