"""Every worker follows its models' serving state in the repository.

A push, activation, rollback, hold or resume received by one worker is written to the
repository (``serve.control.store``) before it is answered. Every ``sync_interval_s`` each
worker looks at each model's ``.serving.json`` (one ``stat`` while nothing changed) and
applies a newer generation through the same updater a push uses: it loads the version from
the repository if it is not resident, activates it, holds or resumes. So every worker of
a pod, and every replica sharing the repository, serves the same version within
``sync_interval_s`` plus the time to load it, and a restart serves what was last
acknowledged. After each pass the worker publishes what it serves
(``serve.control.workers``), which is how a push learns which workers have it.

A version that fails to load here stays reported in ``GET /v1/models/{model}`` and is
tried again every ``RETRY_FAILED_S`` seconds until it loads or the state moves on.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kernel.errors import RLServeError
from serve.control import store
from serve.control.manager import ModelRepositoryManager
from serve.control.updates import Updater
from serve.control.workers import WorkerRegistry

log = logging.getLogger("rlserve.sync")

RETRY_FAILED_S = 10.0


class RepositorySync:
    def __init__(
        self,
        manager: ModelRepositoryManager,
        updater: Updater,
        registry: WorkerRegistry,
        interval_s: float,
    ) -> None:
        self.manager = manager
        self.updater = updater
        self.registry = registry
        self.interval_s = interval_s
        self._stamps: dict[str, tuple[int, int]] = {}  # the state file as last applied
        self._retry_at: dict[str, float] = {}  # models whose last apply failed

    async def run(self) -> None:
        """Follow the repository for ever; a failed pass is logged and the next one retries."""
        await self.registry.publish()
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sync_once()
            except Exception:
                log.exception("syncing with the repository failed; trying again")

    async def sync_once(self) -> None:
        root = self.manager.settings.model_repository
        for name in list(self.manager.models):
            stamp = await asyncio.to_thread(store.state_stamp, root / name)
            if stamp is None or self._retry_at.get(name, 0.0) > time.monotonic():
                continue  # no serving state, or backing off after a failure
            if stamp == self._stamps.get(name) and name not in self._retry_at:
                continue  # nothing new
            state = await asyncio.to_thread(store.read_state, root / name)
            if state is None:
                continue
            try:
                await self.updater.follow(name, state)
            except RLServeError as exc:
                self._retry_at[name] = time.monotonic() + RETRY_FAILED_S
                log.error(
                    "model %s: cannot apply serving state generation %d (version %s): %s; "
                    "retrying in %gs",
                    name,
                    state.generation,
                    state.active,
                    exc.message,
                    RETRY_FAILED_S,
                )
                continue
            self._retry_at.pop(name, None)
            self._stamps[name] = stamp
        await self.registry.publish()
