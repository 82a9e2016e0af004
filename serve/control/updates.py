"""Live policy updates: push a version, activate it between batches, roll back, hold.

Every update of a model goes through :class:`Updater`, one at a time per model, whether it
comes from ``PUT /v1/models/{model}/versions/{version}`` (push) or from the repository
watcher (pull). The semantics:

- **off the hot path**: the new session is built, checked (same spaces as the live
  version, golden vectors, optional canary) and warmed on a worker thread while the old
  version keeps serving;
- **atomic**: activation is one assignment on the event loop, so it lands between batches;
  ``at_batch_boundary`` moves queued requests to the new version at their next batch,
  ``drain`` keeps requests queued before the swap on the old version;
- **monotonic**: a version not newer than the active one is refused (409) unless the caller
  says it is a rollback; **idempotent**: the same version and checksum again changes nothing;
- **all-or-nothing**: any failure leaves the old version serving and says why;
- **canaries** (issue 45): a canary version serves a share of the model's episodes beside
  the live one until it is promoted (activated) or rolled back (``start_canary``,
  ``end_canary``), recorded in the serving state like an activation;
- **durable and shared**: a pushed version is written into the model repository, and every
  activation, rollback, hold and resume into the model's serving state there
  (``serve.control.store``), before the answer; the other workers and replicas follow it
  (``serve.control.sync``), and the answer says which workers already serve it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from kernel.errors import Conflict, InvalidInput, NotFound, RLServeError, ServiceUnavailable
from serve.config import Settings
from serve.control import repository, store
from serve.control.canary_assignment import CanaryPlan, Judge
from serve.control.lifecycle import ModelLifeCycle
from serve.control.manager import ModelRepositoryManager
from serve.control.return_gate import Verdict
from serve.control.store import ServingState
from serve.control.workers import Propagation, WorkerRegistry
from serve.dataplane.model import ServedModel
from serve.metrics import Metrics
from serve.plugins import Canary, plugin_of
from serve.types import CanaryMode

log = logging.getLogger("rlserve.updates")


class ActivationMode(StrEnum):
    AT_BATCH_BOUNDARY = "at_batch_boundary"
    DRAIN = "drain"


class UpdateResult(StrEnum):
    ACTIVATED = "activated"
    LOADED = "loaded"  # resident, not active (activate=false)
    UNCHANGED = "unchanged"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class Push:
    """A version to serve: its file (a staged upload, or the version's own file in the
    repository) and the sha256 its sender claims for it (None: the file is its own
    reference, as a version found in the repository is)."""

    model: str
    version: int
    source: Path
    sha256: str | None
    activate: bool = True
    mode: ActivationMode = ActivationMode.AT_BATCH_BOUNDARY
    rollback: bool = False  # allow a version not newer than the active one
    canary: Canary | None = None
    wait_s: float = 0.0  # how long to wait for the other workers to serve it


@dataclass(frozen=True)
class UpdateReport:
    model: str
    version: int
    result: UpdateResult
    active_version: int | None
    previous_version: int | None
    sha256: str = ""
    load_s: float = 0.0
    swap_s: float = 0.0
    propagation: Propagation | None = None

    def to_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in self.__dict__.items() if k != "propagation"}
        spread = self.propagation.to_json() if self.propagation else {}
        return {**fields, "result": self.result.value, **spread}


class Updater:
    def __init__(
        self,
        manager: ModelRepositoryManager,
        settings: Settings,
        metrics: Metrics,
        registry: WorkerRegistry,
    ) -> None:
        self.manager = manager
        self.settings = settings
        self.metrics = metrics
        self.registry = registry
        self._locks: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------------ push

    async def push(self, push: Push) -> UpdateReport:
        """Check, load and place a version (the staged upload is removed, whatever happens)."""
        try:
            entry = self._entry(push.model)
            async with self._lock(push.model):
                report = await self._push_locked(entry, push)
        finally:
            await asyncio.to_thread(store.discard, push.source)
        return await self._spread(report, entry.generation, push.wait_s)

    async def _push_locked(self, entry: ModelLifeCycle, push: Push) -> UpdateReport:
        try:
            report = await self._push(entry, push)
        except RLServeError as exc:
            self.metrics.updates.labels(push.model, exc.code).inc()
            log.warning("update %s/%d refused: %s", push.model, push.version, exc.message)
            raise
        self.metrics.updates.labels(push.model, report.result.value).inc()
        return report

    async def _push(self, entry: ModelLifeCycle, push: Push) -> UpdateReport:
        digest = await asyncio.to_thread(_sha256_of, push)  # hashing a large model takes a while
        previous = entry.active
        resident = entry.get(push.version)
        if resident is not None:
            return _unchanged(entry, push.version, digest, resident)
        self._check_order(entry, push.version, push.rollback)
        started = time.monotonic()
        model = await self._load(entry, push.version, push.source, push.canary, digest)
        load_s = time.monotonic() - started
        root = self.settings.model_repository
        await asyncio.to_thread(
            store.place, root, entry.name, push.version, push.source, model.sha256
        )
        self.metrics.update_load.labels(entry.name).observe(load_s)
        entry.loaded(model)
        self.metrics.version_loaded(entry.name, model)
        if not push.activate:
            return UpdateReport(
                entry.name,
                push.version,
                UpdateResult.LOADED,
                previous,
                previous,
                model.sha256,
                load_s,
            )
        swap_s = await self._decide(entry, push.version, push.mode, allow_older=push.rollback)
        return UpdateReport(
            entry.name,
            push.version,
            UpdateResult.ACTIVATED,
            push.version,
            previous,
            model.sha256,
            load_s,
            swap_s,
        )

    def check_push(self, name: str, version: int, rollback: bool) -> None:
        """Refuse a push before its upload when it could never land: an unknown model, or a
        version not newer than the active one."""
        entry = self._entry(name)
        if entry.get(version) is None:
            self._check_order(entry, version, rollback)

    # ------------------------------------------------------------------ activate, rollback, hold

    async def activate(
        self, name: str, version: int, mode: ActivationMode, rollback: bool, wait_s: float = 0.0
    ) -> UpdateReport:
        entry = self._entry(name)
        async with self._lock(name):
            model = entry.get(version)
            if model is None:
                resident = [m.version for m in entry.resident()]
                raise NotFound(
                    f"model {name!r} has no resident version {version}; resident: {resident}"
                )
            previous = entry.active
            if version == previous:
                return UpdateReport(
                    name, version, UpdateResult.UNCHANGED, previous, previous, model.sha256
                )
            self._check_order(entry, version, rollback)
            swap_s = await self._decide(entry, version, mode, allow_older=rollback)
        report = UpdateReport(
            name, version, UpdateResult.ACTIVATED, version, previous, model.sha256, 0.0, swap_s
        )
        return await self._spread(report, entry.generation, wait_s)

    async def rollback(
        self, name: str, wait_s: float = 0.0, version: int | None = None
    ) -> UpdateReport:
        """Re-activate a resident version at once: ``version``, which must be older than the
        active one, or by default the previously active one (undoing the last activation)."""
        entry = self._entry(name)
        async with self._lock(name):
            current = entry.active
            target = entry.previous() if version is None else _rollback_target(entry, version)
            if target is None or current is None:
                raise Conflict(f"model {name!r}: no previous version is resident to roll back to")
            model = entry.get(target)
            sha = model.sha256 if model else ""
            if target == current:
                return UpdateReport(name, target, UpdateResult.UNCHANGED, current, current, sha)
            swap_s = await self._decide(
                entry, target, ActivationMode.AT_BATCH_BOUNDARY, allow_older=True
            )
        self.metrics.updates.labels(name, UpdateResult.ROLLED_BACK.value).inc()
        report = UpdateReport(
            name, target, UpdateResult.ROLLED_BACK, target, current, sha, 0.0, swap_s
        )
        return await self._spread(report, entry.generation, wait_s)

    async def hold(
        self, name: str, max_hold_s: float | None = None, wait_s: float = 0.0
    ) -> Propagation:
        """Serve nothing from the model until resume (or ``max_hold_s``), on every worker."""
        entry = self._entry(name)
        until = None if max_hold_s is None else time.time() + max_hold_s
        async with self._lock(name):
            state = await self._record(entry, lambda cur: _holding(cur, entry, until))
            entry.hold(max_hold_s)
            entry.generation = state.generation
        return await self._spread_generation(name, state.generation, wait_s)

    async def resume(self, name: str, wait_s: float = 0.0) -> Propagation:
        entry = self._entry(name)
        async with self._lock(name):
            state = await self._record(entry, lambda cur: _holding(cur, entry, None, held=False))
            entry.resume()
            entry.generation = state.generation
        return await self._spread_generation(name, state.generation, wait_s)

    # ------------------------------------------------------------------ canary

    async def start_canary(self, plan: CanaryPlan, wait_s: float = 0.0) -> Propagation:
        """Serve ``plan.share`` of the model's episodes on ``plan.version`` (loaded from the
        repository if it is not resident, and checked to fit the live version), on every
        worker. A model has one canary at a time: another one running is a Conflict."""
        entry = self._entry(plan.model)
        async with self._lock(plan.model):
            live = entry.active
            if live is None:
                raise ServiceUnavailable(f"model {plan.model!r} has no live version yet")
            if plan.version == live:
                raise Conflict(
                    f"model {plan.model!r}: version {live} is the live version already; a "
                    "canary serves another version beside it"
                )
            if plan.mode is CanaryMode.SHADOW and plugin_of(entry.kind).compare is None:
                raise InvalidInput(
                    f"mode: model {plan.model!r} is a {entry.kind.noun}, whose versions rlserve "
                    "cannot compare in shadow; run an episodes canary instead"
                )
            if entry.canary is not None:
                raise Conflict(
                    f"model {plan.model!r} has a canary already (version "
                    f"{entry.canary.version}); promote it or roll it back first"
                )
            if entry.get(plan.version) is None:
                await self._check_on_disk(entry, plan.version)
                await self._load_from_repository(entry, plan.version)
            canary = entry.get(plan.version)
            assert canary is not None
            await asyncio.to_thread(_check_compatible, entry, canary, None)
            state = await self._record(entry, lambda cur: _with_canary(cur, entry, plan))
            entry.follow_canary(plan)
            entry.generation = state.generation
        log.info(
            "model %s: canary version %d serves %g of episodes beside version %d (%s)",
            plan.model, plan.version, plan.share, live, plan.action.value,
        )  # fmt: skip
        return await self._spread_generation(plan.model, state.generation, wait_s)

    async def start_configured_canary(self, name: str) -> None:
        """Start the canary a model's config.yaml declares, unless the serving state has a
        canary, or has one of that version ended (a configured canary runs once), or that
        version is live already. Logged, never raised: a server starts without it."""
        entry = self._entry(name)
        wanted = entry.settings.canary
        if wanted is None or wanted.version == entry.active:
            return
        model_dir = self.settings.model_repository / name
        state = await asyncio.to_thread(store.read_state, model_dir)
        if state is not None and (state.canary is not None or wanted.version in state.judged):
            return
        try:
            await self.start_canary(CanaryPlan.of(name, wanted, time.time()))
        except Conflict:
            return  # another worker started it first
        except (RLServeError, ValueError) as exc:
            message = exc.message if isinstance(exc, RLServeError) else str(exc)
            log.error("model %s: its config.yaml's canary was not started: %s", name, message)

    async def end_canary(
        self,
        name: str,
        verdict: Verdict,
        by: Judge,
        salt: str | None = None,
        wait_s: float = 0.0,
    ) -> UpdateReport:
        """End the model's canary: PROMOTE activates its version, ROLLBACK leaves the live
        one serving every episode; counted by who ended it. ``salt``: only the canary it
        names (the gate's own verdict must not end a canary started since); NotFound with
        no such canary."""
        entry = self._entry(name)
        async with self._lock(name):
            plan = entry.canary
            if plan is None or (salt is not None and plan.salt != salt):
                raise NotFound(f"model {name!r} has no canary running")
            previous = entry.active
            mode = ActivationMode.AT_BATCH_BOUNDARY

            def change(current: ServingState | None) -> ServingState:
                ended = _with_canary(current, entry, None)
                ended = dataclasses.replace(ended, judged=(*ended.judged, plan.version))
                if verdict is not Verdict.PROMOTE:
                    return ended
                return _activating(ended, name, plan.version, mode, allow_older=True)

            state = await self._record(entry, change)
            entry.follow_canary(None)
            if verdict is Verdict.PROMOTE:
                self._activate(entry, plan.version, mode)
            entry.generation = state.generation
        result = UpdateResult.ACTIVATED if verdict is Verdict.PROMOTE else UpdateResult.ROLLED_BACK
        served = entry.get(plan.version)
        report = UpdateReport(
            name, plan.version, result, entry.active, previous, served.sha256 if served else ""
        )
        self.metrics.canary_ended(name, verdict.value, by.value)
        log.info("model %s: canary version %d ended: %s", name, plan.version, verdict.value)
        return await self._spread(report, state.generation, wait_s)

    # ------------------------------------------------------------------ following the repository

    async def follow(self, name: str, state: ServingState) -> None:
        """Apply a serving state another worker recorded: load its version from the
        repository if it is not resident, activate it, hold or resume."""
        entry = self._entry(name)
        async with self._lock(name):
            if state.generation <= entry.generation:
                return
            if state.active is not None and state.active != entry.active:
                if entry.get(state.active) is None:
                    await self._load_from_repository(entry, state.active)
                self._activate(entry, state.active, _known_mode(state.mode))
            canary = state.canary
            if canary is not None and entry.get(canary.version) is None:
                await self._load_from_repository(entry, canary.version)
            entry.follow_canary(canary)
            held = state.held_now(time.time())
            if held:
                remaining = None if state.hold_until is None else state.hold_until - time.time()
                entry.hold(remaining)
            elif entry.held_since is not None:
                entry.resume()
            entry.generation = state.generation
            log.info(
                "model %s: following the repository, generation %d: version %s%s",
                name,
                state.generation,
                state.active,
                " (held)" if held else "",
            )

    async def _check_on_disk(self, entry: ModelLifeCycle, version: int) -> None:
        """NotFound, naming the versions there, unless the repository has ``version``."""
        model_dir = self.settings.model_repository / entry.name
        found = [v.version for v in await asyncio.to_thread(repository.versions_of, model_dir)]
        if version not in found:
            raise NotFound(
                f"model {entry.name!r} has no version {version} in the repository; versions "
                f"there: {found} (push it first, with activate=false)"
            )

    async def _load_from_repository(self, entry: ModelLifeCycle, version: int) -> None:
        path = self.settings.model_repository / entry.name / str(version) / repository.MODEL_FILE
        entry.loading(version)
        try:
            model = await self._load(entry, version, path, None)
        except RLServeError as exc:
            entry.failed(version, exc.message)
            raise
        entry.loaded(model)
        self.metrics.version_loaded(entry.name, model)

    # ------------------------------------------------------------------ steps

    async def _load(
        self,
        entry: ModelLifeCycle,
        version: int,
        source: Path,
        canary: Canary | None,
        sha256: str | None = None,
    ) -> ServedModel:
        """Build, verify and warm a version on a worker thread (``sha256``: the file's, when
        already known); check it fits the live one."""
        model = await asyncio.to_thread(
            repository.load_file,
            entry.name,
            version,
            source,
            self.settings,
            entry.settings,
            sha256,
        )
        await asyncio.to_thread(_check_compatible, entry, model, canary)
        return model

    async def _decide(
        self,
        entry: ModelLifeCycle,
        version: int,
        mode: ActivationMode,
        *,
        allow_older: bool,
    ) -> float:
        """Record the activation in the repository, then make it here."""

        def change(current: ServingState | None) -> ServingState:
            return _activating(current, entry.name, version, mode, allow_older=allow_older)

        state = await self._record(entry, change)
        swap_s = self._activate(entry, version, mode)
        entry.generation = state.generation
        return swap_s

    async def _record(
        self, entry: ModelLifeCycle, change: Callable[[ServingState | None], ServingState]
    ) -> ServingState:
        model_dir = self.settings.model_repository / entry.name
        return await asyncio.to_thread(store.update_state, model_dir, change)

    async def _spread(self, report: UpdateReport, generation: int, wait_s: float) -> UpdateReport:
        """The report, with which workers serve the model's current generation."""
        spread = await self._spread_generation(report.model, generation, wait_s)
        return dataclasses.replace(report, propagation=spread)

    async def _spread_generation(self, name: str, generation: int, wait_s: float) -> Propagation:
        await self.registry.publish()
        return await self.registry.wait_for(name, generation, wait_s)

    def _activate(self, entry: ModelLifeCycle, version: int, mode: ActivationMode) -> float:
        started = time.perf_counter()
        previous = entry.active
        if mode is ActivationMode.DRAIN and previous is not None:
            entry.scheduler.pin_queued(previous)
        entry.activate(version)
        swap_s = time.perf_counter() - started
        keep, queued_for = self.settings.resident_versions, entry.scheduler.pinned_versions()
        if entry.sequences is not None:  # a live sequence keeps the version it started with
            queued_for |= entry.sequences.versions()
        for gone in entry.evict(keep, queued_for):
            self.metrics.version_unloaded(entry.name, gone.version, gone.provider, gone.sha256)
            log.info(
                "model %s: version %d unloaded (resident_versions %d)",
                entry.name,
                gone.version,
                self.settings.resident_versions,
            )
        self.metrics.policy_version.labels(entry.name).set(version)
        self.metrics.update_swap.labels(entry.name).observe(swap_s)
        log.info("model %s: version %s -> %d (%s)", entry.name, previous, version, mode.value)
        return swap_s

    def _check_order(self, entry: ModelLifeCycle, version: int, rollback: bool) -> None:
        active = entry.active
        if active is not None and version <= active and not rollback:
            raise Conflict(
                f"model {entry.name!r}: version {version} is not newer than the active version "
                f"{active}; versions only move forward unless rollback=true"
            )

    def _entry(self, name: str) -> ModelLifeCycle:
        return self.manager.lifecycle(name)

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())


def _sha256_of(push: Push) -> str:
    """The pushed file's sha256 (read once), checked against the sender's claim."""
    actual = repository.file_sha256(push.source, f"{push.model}/{push.version}")
    if push.sha256 is not None and actual != push.sha256.lower():
        raise InvalidInput(
            f"sha256: the model bytes hash to {actual}, not {push.sha256}; "
            "the upload is corrupt or the checksum is wrong"
        )
    return actual


def _rollback_target(entry: ModelLifeCycle, version: int) -> int:
    """The version a rollback names, if it can be served at once: resident (no load) and
    not newer than the active one (the active one itself: nothing to do)."""
    resident = [m.version for m in entry.resident()]
    active = entry.active
    if active is not None and version > active:
        raise Conflict(
            f"model {entry.name!r}: version {version} is newer than the active version "
            f"{active}; a rollback goes back, so activate it instead "
            f"(POST /v1/models/{entry.name}/versions/{version}/activate)"
        )
    if entry.get(version) is None:
        raise Conflict(
            f"model {entry.name!r}: version {version} is not resident, so it cannot be rolled "
            f"back to at once; resident: {resident} (resident_versions says how many stay "
            f"loaded); push it again with rollback=true (by path: {entry.name}/{version}/"
            "model.onnx), which loads and activates it"
        )
    return version


def _activating(
    current: ServingState | None,
    name: str,
    version: int,
    mode: ActivationMode,
    *,
    allow_older: bool,
) -> ServingState:
    """The serving state with ``version`` active; versions only move forward there too (a
    worker that has not yet followed the others must not move the model back)."""
    if current is None:
        return ServingState(0, version, mode=mode.value)
    if current.active is not None and version < current.active and not allow_older:
        raise Conflict(
            f"model {name!r}: version {version} is older than version {current.active}, which "
            "another worker activated; versions only move forward unless rollback=true"
        )
    return dataclasses.replace(current, active=version, mode=mode.value)


def _holding(
    current: ServingState | None,
    entry: ModelLifeCycle,
    until: float | None,
    *,
    held: bool = True,
) -> ServingState:
    base = current or ServingState(0, entry.active)
    return dataclasses.replace(base, held=held, hold_until=until if held else None)


def _with_canary(
    current: ServingState | None, entry: ModelLifeCycle, plan: CanaryPlan | None
) -> ServingState:
    base = current or ServingState(0, entry.active)
    if plan is not None and base.canary is not None and base.canary.salt != plan.salt:
        raise Conflict(
            f"model {entry.name!r} has a canary already (version {base.canary.version}), "
            "started by another worker; promote it or roll it back first"
        )
    return dataclasses.replace(base, canary=plan)


def _known_mode(value: str) -> ActivationMode:
    try:
        return ActivationMode(value)
    except ValueError:
        return ActivationMode.AT_BATCH_BOUNDARY


def _unchanged(
    entry: ModelLifeCycle, version: int, sha256: str, resident: ServedModel
) -> UpdateReport:
    if resident.sha256 != sha256:
        raise Conflict(
            f"model {entry.name!r} version {version} is already loaded with sha256 "
            f"{resident.sha256}; a changed model needs a new version number"
        )
    active = entry.active
    return UpdateReport(entry.name, version, UpdateResult.UNCHANGED, active, active, sha256)


def _check_compatible(entry: ModelLifeCycle, pushed: ServedModel, canary: Canary | None) -> None:
    """A new version must fit the live one, as its kind says (a policy: the same spaces,
    and the canary's log-probs reproduced)."""
    plugin_of(pushed.model_kind).check_update(entry.active_model, pushed, canary)
