"""Pull mode: activate version directories (and models) that appear in the repository.

Every ``poll_interval_s`` the repository is listed; a version of a served model that is
newer than any version seen before goes through the same path as a push
(``serve.control.updates``), and a model that was not there at start-up is loaded as at
start-up. A version counts once its ``model.onnx`` exists, so writers must put
it in place atomically: write elsewhere and rename (``rlserve export`` writes a hidden
directory and renames it). A rollback holds: the versions it stepped back from were
already seen, so only a newer version replaces it.

A model whose directory cannot be loaded (an invalid ``config.yaml``, say) is reported
and tried again once the directory changes.

A version that fails to load (a file still being written, a corrupt one) is reported in
``GET /v1/models/{model}`` and counted in ``rlserve_weight_updates_total``, and tried again
once its file changes. A directory whose name is not a version number is reported once and
skipped; a poll that fails for any reason is logged, and the next poll tries again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from kernel.errors import ModelLoadError, RLServeError
from kernel.versions import DESCRIPTION
from serve.control import repository
from serve.control.manager import ModelRepositoryManager
from serve.control.updates import Push, Updater

log = logging.getLogger("rlserve.watcher")


class RepositoryWatcher:
    def __init__(
        self, manager: ModelRepositoryManager, updater: Updater, interval_s: float
    ) -> None:
        self.manager = manager
        self.updater = updater
        self.interval_s = interval_s
        self._seen: dict[str, int] = {}  # the newest version handled, per model
        self._failed: dict[tuple[str, int], tuple[int, int]] = {}  # size and mtime when it failed
        self._skipped: set[Path] = set()  # directories already reported as not versions
        self._refused: dict[str, tuple[int, int]] = {}  # new models that failed, and when

    async def run(self) -> None:
        """Poll for ever; a poll that fails is logged and the next one tries again."""
        root = self.manager.settings.model_repository
        # What loading found, not a new listing: what appeared since is still news.
        self._skipped = set(self.manager.skipped)
        self._seen = {name: self._newest_known(name) for name in self.manager.models}
        log.info("watching %s every %gs", root, self.interval_s)
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll()
            except Exception:
                log.exception("polling %s failed; trying again in %gs", root, self.interval_s)

    def _newest_known(self, name: str) -> int:
        """Versions up to this one were seen: loading chose among them, or a rollback (in
        the model's serving state) stepped back from them."""
        state = self.manager.states.get(name)
        wanted = self.manager.models[name].wanted if name in self.manager.models else []
        return max(max(wanted, default=0), state.newest_seen if state else 0)

    async def poll(self) -> None:
        for name, versions in (await self._discover()).items():
            if name not in self.manager.models:
                await self._add(name, versions)
                continue
            for where in versions:
                if where.version > self._seen.get(name, 0) and self._worth_trying(where):
                    await self._pull(where)

    async def _add(self, name: str, versions: list[repository.VersionDir]) -> None:
        root = self.manager.settings.model_repository
        stamp = _stamp(root / name)
        if not versions or self._refused.get(name) == stamp:
            return
        try:
            await self.manager.add(name, versions)
        except RLServeError as exc:
            self._refused[name] = stamp
            self.manager.models.pop(name, None)
            log.error(
                "new model %s not served (tried again when it changes): %s", name, exc.message
            )
            return
        self._refused.pop(name, None)
        self._seen[name] = self._newest_known(name)

    def _worth_trying(self, where: repository.VersionDir) -> bool:
        """A version that failed is tried again once its file changed (it was still being
        written, or it was replaced)."""
        failed_as = self._failed.get((where.model, where.version))
        return failed_as is None or failed_as != _stamp(where.path)

    async def _discover(self) -> dict[str, list[repository.VersionDir]]:
        root = self.manager.settings.model_repository
        found = await asyncio.to_thread(repository.discover, root)
        for skipped in await asyncio.to_thread(repository.skipped_in, root):
            if skipped not in self._skipped:
                self._skipped.add(skipped)
                log.warning(
                    "%s: not a version directory (a version is %s); skipped", skipped, DESCRIPTION
                )
        return found

    async def _pull(self, where: repository.VersionDir) -> None:
        key = (where.model, where.version)
        stamp = _stamp(where.path)
        try:
            report = await self.updater.push(Push(where.model, where.version, where.path, None))
        except (ModelLoadError, OSError) as exc:
            reason = exc.message if isinstance(exc, RLServeError) else str(exc)
            log.error("pull of %s/%d failed (tried again when the file changes): %s", *key, reason)
            self._failed[key] = stamp
            self.manager.lifecycle(where.model).failed(where.version, reason)
            return
        except RLServeError as exc:  # refused for good: not newer, a different file, ...
            log.error("pull of %s/%d refused: %s", *key, exc.message)
            self._seen[where.model] = where.version
            return
        self._failed.pop(key, None)
        self._seen[where.model] = where.version
        log.info("pulled %s/%d: %s in %.2fs", *key, report.result.value, report.load_s)


def _stamp(path: Path) -> tuple[int, int]:
    """What tells a file changed: its size and modification time (0, 0 when it is gone)."""
    try:
        status = path.stat()
    except OSError:
        return (0, 0)
    return (status.st_size, status.st_mtime_ns)
