"""Which workers serve a repository, and what each of them serves.

Every worker (a gunicorn worker process, or the one ``rlserve serve`` process) writes a
small status file into the repository's hidden ``.rlserve/workers/`` folder after every
change and at every sync; a push or rollback reads the others' files to say which workers
already serve its version. A file not refreshed within ``stale_after_s`` belongs to a
worker that stopped (or was killed): it is not waited for, and it is removed after a while.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from serve.control import store
from serve.control.manager import ModelRepositoryManager

log = logging.getLogger("rlserve.workers")

WORKERS_DIR = Path(".rlserve") / "workers"
FORGET_AFTER_S = 300.0  # remove the file of a worker silent this long


@dataclass(frozen=True)
class ModelStatus:
    active: int | None
    generation: int  # the serving-state generation this worker applied
    held: bool
    failed: dict[int, str]


@dataclass(frozen=True)
class WorkerStatus:
    worker: str
    heartbeat: float  # wall-clock seconds
    models: dict[str, ModelStatus]

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "heartbeat": self.heartbeat,
            "models": {
                name: {**m.__dict__, "failed": {str(v): r for v, r in m.failed.items()}}
                for name, m in self.models.items()
            },
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> WorkerStatus:
        models = {
            name: ModelStatus(
                m.get("active"),
                int(m.get("generation", 0)),
                bool(m.get("held", False)),
                {int(v): str(r) for v, r in m.get("failed", {}).items()},
            )
            for name, m in raw.get("models", {}).items()
        }
        return cls(str(raw["worker"]), float(raw["heartbeat"]), models)


@dataclass(frozen=True)
class Propagation:
    """Where a model stands across the workers after an update."""

    workers: dict[str, int | None]  # worker -> its active version
    everywhere: bool  # every live worker applied the update

    def to_json(self) -> dict[str, Any]:
        return {"workers": self.workers, "all_workers": self.everywhere}


class WorkerRegistry:
    def __init__(self, manager: ModelRepositoryManager, stale_after_s: float) -> None:
        self.manager = manager
        self.folder = manager.settings.model_repository / WORKERS_DIR
        self.me = store.worker_id()
        self.stale_after_s = stale_after_s
        self._path = self.folder / (self.me.replace(":", "-") + ".json")
        self._warned = False
        self._writing = threading.Lock()  # a write on a thread never outlives withdraw()
        self._withdrawn = False

    def snapshot(self) -> dict[str, ModelStatus]:
        return {
            name: ModelStatus(m.active, m.generation, m.held_since is not None, dict(m.failures))
            for name, m in self.manager.models.items()
        }

    async def publish(self) -> None:
        """Write what this worker serves now (best effort: a read-only repository is
        logged once)."""
        await asyncio.to_thread(self._write, self.snapshot())

    def _write(self, models: dict[str, ModelStatus]) -> None:
        record = WorkerStatus(self.me, time.time(), models)
        with self._writing:
            if not self._withdrawn:
                self._write_record(record)

    def _write_record(self, record: WorkerStatus) -> None:
        try:
            self.folder.parent.mkdir(exist_ok=True)  # inside the repository, if it is there
            self.folder.mkdir(exist_ok=True)
            store.write_atomic(self._path, orjson.dumps(record.to_json()), durable=False)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot write worker status to %s (%s): pushes will not report other workers",
                    self.folder,
                    exc.strerror,
                )

    def withdraw(self) -> None:
        """Remove this worker's status for good: it stops serving."""
        with self._writing:
            self._withdrawn = True
            self._path.unlink(missing_ok=True)

    def live(self) -> list[WorkerStatus]:
        """Every worker heard from within ``stale_after_s``; long-silent files are removed."""
        now = time.time()
        found = []
        try:
            paths = list(self.folder.glob("*.json"))
        except OSError:
            return []
        for path in paths:
            try:
                status = WorkerStatus.from_json(orjson.loads(path.read_bytes()))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being replaced, or not ours
            age = now - status.heartbeat
            if age <= self.stale_after_s:
                found.append(status)
            elif age > FORGET_AFTER_S:
                path.unlink(missing_ok=True)
        return sorted(found, key=lambda s: s.worker)

    async def wait_for(self, model: str, generation: int, timeout_s: float) -> Propagation:
        """Wait until every live worker applied ``generation`` of ``model`` (or timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            workers = await asyncio.to_thread(self.live)
            applied = {
                w.worker: w.models[model] for w in workers if model in w.models
            }  # a worker that does not serve the model is not waited for
            done = all(m.generation >= generation for m in applied.values())
            if done or time.monotonic() >= deadline:
                return Propagation({w: m.active for w, m in applied.items()}, done)
            await asyncio.sleep(0.05)
