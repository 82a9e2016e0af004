"""The loaded models: which versions serve, their batchers, and what failed to load.

Loading happens off the event loop, one version at a time, while the server already
answers /health (and /ready with 503). A version that fails to load is recorded with its
reason and the others still load; a model with no loadable version keeps /ready red.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from serve.config import ModelSettings, Settings, load_model_overrides
from serve.control import repository
from serve.control.versions import VersionTable
from serve.dataplane.dynamic_batcher import Batcher
from serve.dataplane.model import ServedModel
from serve.errors import NotFound, RLServeError, ServiceUnavailable
from serve.metrics import Metrics
from serve.types import ModelState

log = logging.getLogger("rlserve.registry")


@dataclass
class ModelEntry:
    name: str
    settings: ModelSettings
    batcher: Batcher
    versions: VersionTable
    wanted: list[int]  # versions the version policy selected at start-up
    failures: dict[int, str] = field(default_factory=dict)

    @property
    def state(self) -> ModelState:
        if self.versions.active is not None:
            return ModelState.READY
        pending = set(self.wanted) - set(self.failures)
        return ModelState.LOADING if pending else ModelState.FAILED


@dataclass(frozen=True)
class Route:
    """Where a request goes: the model's batcher, the version that validates it, and the
    version it is pinned to (None: whichever is active when its batch forms)."""

    entry: ModelEntry
    model: ServedModel
    pinned: int | None


class Registry:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, ModelEntry] = {}
        self.loading_done = False
        self.fatal: str | None = None  # why the repository itself could not be loaded

    # ------------------------------------------------------------------ loading

    async def load_all(self) -> None:
        """Discover the repository, load every selected version, activate the newest."""
        found = await asyncio.to_thread(repository.discover, self.settings.model_repository)
        plans = {name: self._plan(name, versions) for name, versions in found.items()}
        for entry, _ in plans.values():
            self.models[entry.name] = entry
            entry.batcher.start()
        for entry, selected in plans.values():
            for where in selected:
                await self._load(entry, where)
            loaded = [m.version for m in entry.versions.resident()]
            if loaded:
                entry.versions.activate(max(loaded))
                self.metrics.policy_version.labels(entry.name).set(max(loaded))
        self.loading_done = True

    def _plan(
        self, name: str, versions: list[repository.VersionDir]
    ) -> tuple[ModelEntry, list[repository.VersionDir]]:
        overrides = load_model_overrides(self.settings.model_repository / name / "config.yaml")
        settings = self.settings.for_model(overrides)
        selected = repository.select(versions, settings.version_policy)
        if not selected:
            log.error(
                "model %s: no version matches its version policy %s", name, settings.version_policy
            )
        table = VersionTable()
        batcher = Batcher(name, table, settings, self.metrics)
        return ModelEntry(name, settings, batcher, table, [v.version for v in selected]), selected

    async def _load(self, entry: ModelEntry, where: repository.VersionDir) -> None:
        try:
            model = await asyncio.to_thread(
                repository.load_version, where, self.settings, entry.settings
            )
        except RLServeError as exc:
            log.error("model %s version %d not loaded: %s", entry.name, where.version, exc.message)
            entry.failures[where.version] = exc.message
            return
        entry.versions.add(model)
        self.metrics.model_info.labels(
            model.name, str(model.version), model.provider, model.sha256
        ).set(1)

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

    def resolve(self, model: str | None, version: int | None) -> Route:
        name = model if model is not None else self.default_model()
        entry = self.models.get(name)
        if entry is None:
            hint = "still discovering the repository" if not self.loading_done else "unknown model"
            raise NotFound(f"model {name!r}: {hint}; loaded models: {sorted(self.models)}")
        chosen = entry.versions.get(version) if version is not None else entry.versions.active_model
        if chosen is not None:
            return Route(entry, chosen, version)
        if entry.state is ModelState.LOADING or (
            version in entry.wanted and version not in entry.failures
        ):
            raise ServiceUnavailable(f"model {name!r} is still loading; retry shortly")
        resident = [m.version for m in entry.versions.resident()]
        raise NotFound(
            f"model {name!r} has no version {version} loaded; loaded versions: {resident}"
            + (f"; failed: {entry.failures}" if entry.failures else "")
        )

    # ------------------------------------------------------------------ readiness

    def unready_reasons(self) -> list[str]:
        if self.fatal is not None:
            return [self.fatal]
        if not self.loading_done:
            return ["loading models"]
        reasons = [
            f"model {m.name!r} has no loaded version: {m.failures}"
            for m in self.models.values()
            if not m.versions
        ]
        if not self.models:
            reasons.append(f"no models found in {self.settings.model_repository}")
        if not self.settings.allow_cpu_fallback:
            reasons += [
                f"model {m.name!r} version {m.version} is not running on requested "
                f"{list(m.provider_report.missing)} (set allow_cpu_fallback: true to accept)"
                for entry in self.models.values()
                for m in entry.versions.resident()
                if m.provider_report.missing
            ]
        return reasons

    def describe(self, name: str) -> dict[str, Any]:
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(
                f"model {name!r} is not in the repository; models: {sorted(self.models)}"
            )
        s = entry.settings
        return {
            "name": name,
            "state": entry.state.value,
            "active_version": entry.versions.active,
            "held": entry.batcher.held,
            "versions": [{**m.describe(), "state": "ready"} for m in entry.versions.resident()],
            "failed_versions": [
                {"version": k, "state": "failed", "reason": r} for k, r in entry.failures.items()
            ],
            "batching": {
                "max_batch_size": s.max_batch_size,
                "max_wait_ms": s.max_wait_ms,
                "max_queue_rows": s.max_queue_rows,
                "default_deadline_ms": s.default_deadline_ms,
            },
            "version_policy": s.version_policy.model_dump(exclude_none=True),
        }

    async def stop(self) -> None:
        await asyncio.gather(*(entry.batcher.stop() for entry in self.models.values()))
