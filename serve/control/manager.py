"""The model repository manager: every model's lifecycle, loading, lookup and readiness.

Loading happens off the event loop, one version at a time, while the server already
answers /health (and /ready with 503). A version that fails to load is recorded with its
reason and the others still load; a model with no loadable version keeps /ready red.

A model's scheduler is chosen before its versions load, from what its newest version
directory holds: language models (a tokenizer beside model.onnx) get the continuous-batching
scheduler, every other model the dynamic batcher. A version of the other kind than its
model's scheduler is refused when it loads.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernel.errors import NotFound, RLServeError, ServiceUnavailable, quoted
from kernel.versions import DESCRIPTION
from serve.batching.record import RecordSink
from serve.config import Settings, load_model_overrides
from serve.control import repository, store
from serve.control.canary_assignment import Arm, CanaryPlan
from serve.control.lifecycle import ModelLifeCycle, ReadyState
from serve.dataplane.kinds import ModelKind
from serve.dataplane.model import ServedModel
from serve.dataplane.routing import Route
from serve.dataplane.scheduler import Scheduler
from serve.metrics import Metrics
from serve.plugins import SchedulerParts, plugin_of
from serve.stores.result_cache import CacheSettings

log = logging.getLogger("rlserve.manager")


class ModelRepositoryManager:
    def __init__(self, settings: Settings, metrics: Metrics, sinks: Sequence[RecordSink]) -> None:
        self.settings = settings
        self.metrics = metrics
        self.sinks = tuple(sinks)  # every model's scheduler's, as it is made
        self.models: dict[str, ModelLifeCycle] = {}
        self.loading_done = False
        self.canaries_started = False  # the canaries models' config.yaml declare (ready after)
        self.fatal: str | None = None  # why the repository itself could not be loaded
        self.skipped: set[Path] = set()  # directories that are not versions, as loading found
        self.states: dict[str, store.ServingState] = {}  # serving states found at start-up
        self.result_caches: dict[str, CacheSettings | None] = {}  # by model, from its settings
        self._draws = random.Random()  # canary sides of calls that name no episode

    def add_sink(self, sink: RecordSink) -> None:
        """Hand ``sink`` every batch record of the models loaded from now on (so: of all of
        them, when added before ``load_all``)."""
        self.sinks = (*self.sinks, sink)

    # ------------------------------------------------------------------ loading

    async def load_all(self) -> None:
        """Discover the repository, load every selected version, activate the newest."""
        root = self.settings.model_repository
        found = await asyncio.to_thread(repository.discover, root)
        self.skipped = set(await asyncio.to_thread(repository.skipped_in, root))
        for skipped in sorted(self.skipped):
            log.warning("%s: skipped, not a version (a version is %s)", skipped, DESCRIPTION)
        for name in found:
            state = await asyncio.to_thread(store.read_state, root / name)
            if state is not None:
                self.states[name] = state
        plans = {name: self._plan(name, versions) for name, versions in found.items()}
        for lifecycle, _ in plans.values():
            self.models[lifecycle.name] = lifecycle
            lifecycle.scheduler.start()
        for lifecycle, selected in plans.values():
            await self._start(lifecycle, selected)
        self.loading_done = True

    async def add(self, name: str, versions: list[repository.VersionDir]) -> None:
        """Serve a model that appeared in the repository after start-up (pull mode)."""
        state = await asyncio.to_thread(store.read_state, self.settings.model_repository / name)
        if state is not None:
            self.states[name] = state
        lifecycle, selected = self._plan(name, versions)
        self.models[name] = lifecycle
        lifecycle.scheduler.start()
        await self._start(lifecycle, selected)
        log.info("model %s: new in the repository; serving version %s", name, lifecycle.active)

    async def _start(
        self, lifecycle: ModelLifeCycle, selected: list[repository.VersionDir]
    ) -> None:
        """Load the selected versions; serve what the serving state says, else the newest."""
        for where in selected:
            await self._load(lifecycle, where)
        loaded = [m.version for m in lifecycle.resident()]
        if not loaded:
            return
        state = self.states.get(lifecycle.name)
        chosen = max(loaded)
        if state is not None:
            lifecycle.generation = state.generation
            if state.active in loaded:
                chosen = state.active
            elif state.active is not None:
                log.error(
                    "model %s: its serving state names version %d, which did not load; "
                    "serving version %d",
                    lifecycle.name,
                    state.active,
                    chosen,
                )
        lifecycle.activate(chosen)
        self.metrics.policy_version.labels(lifecycle.name).set(chosen)
        if state is not None and state.canary is not None:
            lifecycle.follow_canary(state.canary)
        if state is not None and state.held_now(time.time()):
            lifecycle.hold(None if state.hold_until is None else state.hold_until - time.time())

    def _plan(
        self, name: str, versions: list[repository.VersionDir]
    ) -> tuple[ModelLifeCycle, list[repository.VersionDir]]:
        overrides = load_model_overrides(self.settings.model_repository / name / "config.yaml")
        settings = self.settings.for_model(overrides)
        self.result_caches[name] = CacheSettings.of(settings)
        selected = repository.select(versions, settings.version_policy)
        state = self.states.get(name)
        recorded = set() if state is None else {state.active, *state.canary_versions()}
        pinned = [v for v in versions if v.version in recorded]
        selected += [v for v in pinned if v not in selected]  # last activated, and a canary
        if not selected:
            log.error(
                "model %s: no version matches its version policy %s", name, settings.version_policy
            )
        kind = repository.model_kind(versions)

        def scheduler(versions: ModelLifeCycle) -> Scheduler:
            parts = SchedulerParts(name, versions, settings, self.metrics, self.sinks)
            return plugin_of(kind).scheduler(parts)

        wanted = [v.version for v in selected]
        lifecycle = ModelLifeCycle(name, settings, wanted, scheduler, kind=kind)
        return lifecycle, selected

    async def _load(self, lifecycle: ModelLifeCycle, where: repository.VersionDir) -> None:
        lifecycle.loading(where.version)
        try:
            model = await asyncio.to_thread(
                repository.load_version, where, self.settings, lifecycle.settings
            )
        except RLServeError as exc:
            log.error(
                "model %s version %d not loaded: %s", lifecycle.name, where.version, exc.message
            )
            lifecycle.failed(where.version, exc.message)
            return
        mismatch = _kind_mismatch(lifecycle, model)
        if mismatch is not None:
            log.error("model %s version %d not loaded: %s", lifecycle.name, where.version, mismatch)
            lifecycle.failed(where.version, mismatch)
            return
        lifecycle.loaded(model)
        self.metrics.version_loaded(model.name, model)

    # ------------------------------------------------------------------ lookup

    def default_model(self) -> str:
        if self.settings.default_model is not None:
            return self.settings.default_model
        if not self.models and not self.loading_done:
            raise ServiceUnavailable("still discovering the model repository; retry shortly")
        if len(self.models) == 1:
            return next(iter(self.models))
        raise NotFound(
            f"POST /predict needs a default model and this server has {sorted(self.models)}; "
            "set default_model, or use POST /v1/models/{model}/predict"
        )

    def resolve(self, model: str | None, version: int | None, episode: str | None = None) -> Route:
        name = model if model is not None else self.default_model()
        lifecycle = self.models.get(name)
        if lifecycle is None:
            hint = "still discovering the repository" if not self.loading_done else "unknown model"
            raise NotFound(f"model {quoted(name)}: {hint}; loaded models: {sorted(self.models)}")
        plan = lifecycle.canary
        by_episode = version is None and plan is not None and plan.assigns
        if by_episode:
            assert plan is not None
            version = self._canary_side(plan, episode)
        chosen = lifecycle.get(version) if version is not None else lifecycle.active_model
        if chosen is not None:
            return Route(
                name,
                lifecycle.kind,
                lifecycle.scheduler,
                chosen,
                version,
                lifecycle.default_deadline_ms,
                self.result_caches.get(name),
                lifecycle.sequences,
                chosen.features or lifecycle.settings.features,
                by_episode,
            )
        state = lifecycle.state if version is None else lifecycle.version_state(version)
        if state is ReadyState.LOADING:
            raise ServiceUnavailable(f"model {name!r} is still loading; retry shortly")
        resident = [m.version for m in lifecycle.resident()]
        raise NotFound(
            f"model {name!r} has no version {version} loaded; loaded versions: {resident}"
            + (f"; failed: {lifecycle.failures}" if lifecycle.failures else "")
        )

    def _canary_side(self, plan: CanaryPlan, episode: str | None) -> int | None:
        """The version a call of ``episode`` is pinned to while its model has a canary:
        the canary's, or None (the live version, whichever is active when its batch forms)."""
        arm, assignment = plan.arm_for(episode, self._draws)
        self.metrics.canary_assigned(plan.model, arm.value, assignment.value)
        return plan.version if arm is Arm.CANARY else None

    def kind_of(self, model: str | None) -> ModelKind | None:
        """The kind of a model (None: the default model); None when there is no such model."""
        try:
            name = model if model is not None else self.default_model()
        except RLServeError:
            return None
        lifecycle = self.models.get(name)
        return None if lifecycle is None else lifecycle.kind

    def model_names(self) -> list[str]:
        return sorted(self.models)

    def versions(self, model: str) -> list[int]:
        """The versions of a model loaded and able to serve."""
        return [served.version for served in self.lifecycle(model).resident()]

    def lifecycle(self, name: str) -> ModelLifeCycle:
        lifecycle = self.models.get(name)
        if lifecycle is None:
            raise NotFound(f"model {quoted(name)} is not served; models: {sorted(self.models)}")
        return lifecycle

    # ------------------------------------------------------------------ readiness

    def unready_reasons(self) -> list[str]:
        if self.fatal is not None:
            return [self.fatal]
        if not self.loading_done:
            return ["loading models"]
        if not self.canaries_started:
            return ["starting the canaries models' config.yaml declare"]
        reasons = [
            f"model {m.name!r} has no loaded version: {m.failures}"
            for m in self.models.values()
            if m.active is None
        ]
        reasons += [
            f"model {m.name!r} is held (for {time.monotonic() - m.held_since:.0f}s); "
            f"POST /v1/models/{m.name}/resume serves it again"
            for m in self.models.values()
            if m.held_since is not None
        ]
        if not self.models:
            reasons.append(f"no models found in {self.settings.model_repository}")
        if not self.settings.allow_cpu_fallback:
            reasons += [
                f"model {m.name!r} version {m.version} is not running on requested "
                f"{list(m.provider_report.missing)} (set allow_cpu_fallback: true to accept)"
                for lifecycle in self.models.values()
                for m in lifecycle.resident()
                if m.provider_report.missing
            ]
        return reasons

    def describe(self, name: str) -> dict[str, Any]:
        return self.lifecycle(name).describe()

    def sample_load(self) -> None:
        """Set the load gauges (queued and pending rows, requests in flight) from now."""
        self.metrics.sample_load({name: m.scheduler.load() for name, m in self.models.items()})

    async def stop(self) -> None:
        await asyncio.gather(*(m.scheduler.stop() for m in self.models.values()))


def _kind_mismatch(lifecycle: ModelLifeCycle, model: ServedModel) -> str | None:
    """Why a loaded version cannot be served by its model's scheduler (None: it can)."""
    if model.model_kind is lifecycle.kind:
        return None
    return (
        f"this version is a {model.model_kind.noun}, but model {lifecycle.name!r} serves "
        f"{lifecycle.kind.noun} versions (its newest version decided, at start-up); serve it "
        "under another model name"
    )
