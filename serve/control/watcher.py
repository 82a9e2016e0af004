"""Pull mode: activate version directories that appear in the model repository.

Every ``poll_interval_s`` the repository is listed; a version of a served model that is
newer than any version seen before goes through the same path as a push
(``serve.control.updates``). A version counts once its ``model.onnx`` exists, so writers must put
it in place atomically: write elsewhere and rename (``rlserve export`` writes a hidden
directory and renames it). A rollback holds: the versions it stepped back from were
already seen, so only a newer version replaces it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

from serve.control import repository
from serve.control.manager import ModelRepositoryManager
from serve.control.updates import Push, Updater
from serve.errors import RLServeError

log = logging.getLogger("rlserve.watcher")


class RepositoryWatcher:
    def __init__(
        self, manager: ModelRepositoryManager, updater: Updater, interval_s: float
    ) -> None:
        self.manager = manager
        self.updater = updater
        self.interval_s = interval_s
        self._seen: dict[str, int] = {}

    async def run(self) -> None:
        self._seen = {name: _newest(found) for name, found in (await self._discover()).items()}
        log.info("watching %s every %gs", self.manager.settings.model_repository, self.interval_s)
        while True:
            await asyncio.sleep(self.interval_s)
            await self.poll()

    async def poll(self) -> None:
        for name, versions in (await self._discover()).items():
            if name not in self.manager.models:
                continue  # new models are picked up at start-up only
            for where in versions:
                if where.version > self._seen.get(name, -1):
                    self._seen[name] = where.version
                    await self._pull(where)

    async def _discover(self) -> dict[str, list[repository.VersionDir]]:
        return await asyncio.to_thread(repository.discover, self.manager.settings.model_repository)

    async def _pull(self, where: repository.VersionDir) -> None:
        try:
            data = await asyncio.to_thread(where.path.read_bytes)
            push = Push(where.model, where.version, data, hashlib.sha256(data).hexdigest())
            report = await self.updater.push(push)
        except (RLServeError, OSError) as exc:
            log.error("pull of %s/%d failed: %s", where.model, where.version, exc)
            return
        log.info(
            "pulled %s/%d: %s in %.2fs",
            where.model,
            where.version,
            report.result.value,
            report.load_s,
        )


def _newest(versions: list[repository.VersionDir]) -> int:
    return max((v.version for v in versions), default=-1)
