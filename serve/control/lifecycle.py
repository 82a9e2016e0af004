"""One model's lifecycle: its versions, their readiness states, which one is active, and
the scheduler that runs its requests.

Version states (Triton's vocabulary):

    LOADING -> READY -> UNLOADING -> (gone)
    LOADING -> UNAVAILABLE          (failed to load; the reason is kept)

An evicted version is UNLOADING from the moment no new batch can pick it until the last
request or batch that still holds it lets go and its session is freed.

A model is READY while it has an active version, LOADING while versions it wants are
still loading, and UNAVAILABLE otherwise. Requests that name no version run on whichever
version is active *when their batch forms*: activating another version is one assignment
on the event loop, so it lands between batches and no batch ever mixes versions.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from serve.config import ModelSettings
from serve.control.canary_assignment import CanaryPlan
from serve.dataplane.kinds import ModelKind
from serve.dataplane.model import ServedModel
from serve.dataplane.scheduler import Scheduler
from serve.plugins import plugin_of

log = logging.getLogger("rlserve.lifecycle")


class ReadyState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    UNAVAILABLE = "unavailable"
    UNLOADING = "unloading"


class ModelLifeCycle:
    def __init__(
        self,
        name: str,
        settings: ModelSettings,
        wanted: list[int],
        scheduler: Callable[[ModelLifeCycle], Scheduler],
        *,
        kind: ModelKind,
    ) -> None:
        self.name = name
        self.kind = kind  # decided at start-up; a version of the other kind is refused
        self.settings = settings
        self.wanted = wanted  # versions the version policy selected at start-up
        self._resident: dict[int, ServedModel] = {}
        self._states: dict[int, ReadyState] = dict.fromkeys(wanted, ReadyState.LOADING)
        self.failures: dict[int, str] = {}  # UNAVAILABLE versions and why
        self._history: list[int] = []  # activations, oldest first
        self._unloading: dict[int, weakref.ref[ServedModel]] = {}
        self.active: int | None = None
        self.scheduler = scheduler(self)  # it finds versions here when batches form
        self.held_since: float | None = None  # monotonic seconds; None while serving
        self._hold_ends: asyncio.TimerHandle | None = None
        self.generation = 0  # the repository's serving state applied here (serve.control.store)
        self.canary: CanaryPlan | None = None  # a share of episodes on another version
        plugin = plugin_of(kind)
        # recurrent policies' server-held memory, per model (kinds that hold it)
        self.sequences = plugin.sequences(name, settings)
        # a call's deadline when it names none: one forward pass, or a whole generation
        self.default_deadline_ms = plugin.default_deadline_ms(settings)

    # ------------------------------------------------------------------ states

    @property
    def state(self) -> ReadyState:
        if self.active is not None:
            return ReadyState.READY
        if ReadyState.LOADING in self._states.values():
            return ReadyState.LOADING
        return ReadyState.UNAVAILABLE

    def version_state(self, version: int) -> ReadyState | None:
        if version in self.unloading():
            return ReadyState.UNLOADING
        return self._states.get(version)

    def unloading(self) -> list[int]:
        """Evicted versions whose session is still held by a request or a batch."""
        self._unloading = {v: ref for v, ref in self._unloading.items() if ref() is not None}
        return sorted(self._unloading)

    def loading(self, version: int) -> None:
        self._states[version] = ReadyState.LOADING
        self.failures.pop(version, None)

    def loaded(self, model: ServedModel) -> None:
        self._resident[model.version] = model
        self._states[model.version] = ReadyState.READY
        self.failures.pop(model.version, None)

    def failed(self, version: int, reason: str) -> None:
        self._states[version] = ReadyState.UNAVAILABLE
        self.failures[version] = reason

    # ------------------------------------------------------------------ versions

    def activate(self, version: int) -> None:
        if version not in self._resident:
            raise KeyError(version)
        if version != self.active:
            self.active = version
            self._history.append(version)

    def follow_canary(self, plan: CanaryPlan | None) -> None:
        """Serve ``plan``'s share of episodes on its version (None: no canary). A plan whose
        version is not resident here is not followed: it is logged, and the live version
        serves every episode."""
        if plan is not None and plan.version not in self._resident:
            log.error(
                "model %s: its canary names version %d, which is not loaded here; the live "
                "version serves every episode",
                self.name,
                plan.version,
            )
            plan = None
        self.canary = plan

    def get(self, version: int) -> ServedModel | None:
        return self._resident.get(version)

    @property
    def active_model(self) -> ServedModel | None:
        return None if self.active is None else self._resident[self.active]

    def resident(self) -> list[ServedModel]:
        return [self._resident[v] for v in sorted(self._resident)]

    def previous(self) -> int | None:
        """The most recently active version before the current one that is still resident."""
        for version in reversed(self._history[:-1]):
            if version in self._resident and version != self.active:
                return version
        return None

    def evict(self, keep: int, protected: set[int]) -> list[ServedModel]:
        """Unload all but the active version, the ``keep - 1`` most recently active others,
        the canary's, and the ``protected`` ones (requests are still queued for them)."""
        recent = [v for v in reversed(self._history) if v in self._resident]
        order = list(dict.fromkeys([*([] if self.active is None else [self.active]), *recent]))
        canary = set() if self.canary is None else {self.canary.version}
        kept = set(order[: max(keep, 1)]) | protected | canary
        gone = [m for v, m in self._resident.items() if v not in kept]
        for model in gone:
            del self._resident[model.version]
            del self._states[model.version]
            self._unloading[model.version] = weakref.ref(model)
        return gone

    # ------------------------------------------------------------------ hold

    def hold(self, max_hold_s: float | None = None) -> None:
        """Run nothing until ``resume``, or for ``max_hold_s`` at most."""
        self.scheduler.hold()
        if self.held_since is None:
            self.held_since = time.monotonic()
        if self._hold_ends is not None:
            self._hold_ends.cancel()
            self._hold_ends = None
        if max_hold_s is not None:
            self._hold_ends = asyncio.get_running_loop().call_later(max_hold_s, self._hold_ended)
        log.info(
            "model %s held%s: requests queue until resume or their deadline",
            self.name,
            "" if max_hold_s is None else f" for {max_hold_s:g}s at most",
        )

    def resume(self) -> None:
        if self._hold_ends is not None:
            self._hold_ends.cancel()
            self._hold_ends = None
        self.held_since = None
        self.scheduler.resume()
        log.info("model %s resumed", self.name)

    def _hold_ended(self) -> None:
        self._hold_ends = None
        log.warning("model %s: its hold reached max_hold_s; serving again", self.name)
        self.resume()

    # ------------------------------------------------------------------ reports

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {
            "name": self.name,
            "state": self.state.value,
            "active_version": self.active,
            "held": self.scheduler.held,
            "held_for_s": None
            if self.held_since is None
            else round(time.monotonic() - self.held_since, 3),
            "versions": [
                {**m.describe(), "state": ReadyState.READY.value} for m in self.resident()
            ],
            "unloading_versions": self.unloading(),
            "failed_versions": [
                {"version": k, "state": ReadyState.UNAVAILABLE.value, "reason": r}
                for k, r in self.failures.items()
            ],
            "batching": {
                "max_batch_size": s.max_batch_size,
                "max_wait_ms": s.max_wait_ms,
                "max_queue_rows": s.max_queue_rows,
                "default_deadline_ms": s.default_deadline_ms,
                "generation_deadline_ms": s.generation_deadline_ms,
                "inline_max_ms": s.inline_max_ms,
            },
            "observation_bounds": s.observation_bounds.value,
            "scheduler": self.scheduler.describe(),
            "canary": None if self.canary is None else self.canary.to_json(),
            "version_policy": s.version_policy.model_dump(exclude_none=True),
            **({} if self.sequences is None else {"sequences": self.sequences.describe()}),
        }
