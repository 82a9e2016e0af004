"""The model repository as the durable record of live updates.

A push is received into a hidden staging directory of the model, checked and loaded from
there, and acknowledged only once it is renamed into place, and an activation,
rollback or hold only once the model's *serving state* says so; every worker of the pod,
every replica sharing the repository and every later start read them from there
(``serve.control.sync``). Two kinds of writes, both atomic (temporary file, fsync,
rename, fsync of the directory), so a reader sees the old record or the new one, never
half of one, and a crash (even ``kill -9``) loses nothing that was acknowledged:

    <repository>/<model>/<version>/model.onnx     a pushed version
    <repository>/<model>/.serving.json            the model's serving state

The serving state is read-modify-written under an advisory lock (``.serving.lock``) so that
two workers updating one model at the same moment both land, one after the other, each
with its own generation number. Names starting with ``.`` are invisible to the repository
listing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kernel.errors import Conflict, ServiceUnavailable
from serve.control.canary_assignment import CanaryPlan
from serve.control.repository import MODEL_FILE, file_sha256, versions_of

STATE_FILE = ".serving.json"
LOCK_FILE = ".serving.lock"


@dataclass(frozen=True)
class ServingState:
    """What every worker serving a model should do: serve ``active`` (or nothing while held)."""

    generation: int  # grows by one with every change; workers apply each generation once
    active: int | None
    held: bool = False
    hold_until: float | None = None  # wall-clock seconds; None: held until resumed
    newest_seen: int = 0  # the newest version on disk when this was written (pull mode)
    mode: str = "at_batch_boundary"  # how the activation lands (serve.control.updates)
    updated_at: float = 0.0  # wall-clock seconds
    by: str = ""  # the worker that wrote it, host:pid
    canary: CanaryPlan | None = None  # a share of episodes on another version (issue 45)
    judged: tuple[int, ...] = ()  # versions whose canary ended (a configured one runs once)

    def held_now(self, now: float) -> bool:
        return self.held and (self.hold_until is None or now < self.hold_until)

    def canary_versions(self) -> list[int]:
        """The canary's version, if the model has one."""
        return [] if self.canary is None else [self.canary.version]

    def same_intent(self, other: ServingState) -> bool:
        """Whether two states ask the same of the workers (so no new generation is needed)."""
        return (self.active, self.held, self.hold_until, self.canary) == (
            other.active,
            other.held,
            other.hold_until,
            other.canary,
        )

    def to_json(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**fields, "canary": None if self.canary is None else self.canary.to_json()}


Change = Callable[["ServingState | None"], "ServingState"]  # the current state -> the wanted one


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# ---------------------------------------------------------------------- versions


def staging(root: Path, model: str, version: int) -> Path:
    """A new hidden directory inside the model's directory (invisible to the repository
    listing) to receive a pushed version's file before it is checked and placed."""
    model_dir = root / model
    with writing_to(root):
        return Path(tempfile.mkdtemp(prefix=f".push-{version}-", dir=model_dir))


def place(root: Path, model: str, version: int, staged: Path, sha256: str) -> Path:
    """Make a staged model file (checked and loaded by now) ``<model>/<version>``, durably:
    fsync the file and its folder, rename the folder into place, fsync the model's
    directory. The same bytes already there: nothing to do; other bytes: Conflict. A file
    that is already the version's own is left alone. Returns the version's model file."""
    final = root / model / str(version)
    target = final / MODEL_FILE
    if staged == target:
        return target
    try:
        if target.is_file():
            return _same_or_conflict(target, model, version, sha256)
        with writing_to(root):
            _fsync_file(staged)
            _fsync_dir(staged.parent)
            try:
                os.rename(staged.parent, final)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return _same_or_conflict(target, model, version, sha256)  # lost a race
            _fsync_dir(final.parent)
        return target
    finally:
        discard(staged)


def discard(staged: Path) -> None:
    """Remove a staging directory (nothing when it was renamed into place)."""
    folder = staged.parent
    if folder.name.startswith(".push-") and folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)


def _same_or_conflict(target: Path, model: str, version: int, sha256: str) -> Path:
    on_disk = file_sha256(target, f"{model}/{version}")
    if on_disk != sha256.lower():
        raise Conflict(
            f"model {model!r} version {version} already exists in the repository with sha256 "
            f"{on_disk}; a changed model needs a new version number"
        )
    return target


# ---------------------------------------------------------------------- serving state


def read_state(model_dir: Path) -> ServingState | None:
    """The model's serving state; None when it has never been written (or is unreadable)."""
    try:
        raw = orjson.loads((model_dir / STATE_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(raw, dict):
        return None
    fields = {f.name for f in dataclasses.fields(ServingState)}
    try:
        canary = raw.get("canary")
        plan = None if canary is None else CanaryPlan.from_json(canary)
        known = {k: v for k, v in raw.items() if k in fields}
        judged = tuple(int(v) for v in raw.get("judged", ()))
        return ServingState(**{**known, "canary": plan, "judged": judged})
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def state_stamp(model_dir: Path) -> tuple[int, int] | None:
    """What tells the serving state changed without reading it: (size, mtime)."""
    try:
        status = (model_dir / STATE_FILE).stat()
    except OSError:
        return None
    return (status.st_size, status.st_mtime_ns)


def update_state(model_dir: Path, change: Change) -> ServingState:
    """Read, change and write the model's serving state under its lock. ``change`` gets the
    current state (None if none) and returns the wanted one; its generation is set here.
    An unchanged intent writes nothing and returns the current state."""
    with writing_to(model_dir.parent), _locked(model_dir / LOCK_FILE):
        current = read_state(model_dir)
        wanted = change(current)
        if current is not None and wanted.same_intent(current):
            return current
        newest = max((v.version for v in versions_of(model_dir)), default=0)
        written = dataclasses.replace(
            wanted,
            generation=(current.generation if current else 0) + 1,
            newest_seen=max(newest, wanted.newest_seen),
            updated_at=time.time(),
            by=worker_id(),
        )
        write_atomic(model_dir / STATE_FILE, orjson.dumps(written.to_json()), durable=True)
        return written


# ---------------------------------------------------------------------- files


def write_atomic(path: Path, data: bytes, *, durable: bool) -> None:
    """Replace ``path`` with ``data`` at once; ``durable`` also survives a power cut."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if durable:
        _write_synced(staging, data)
    else:
        staging.write_bytes(data)
    os.replace(staging, path)
    if durable:
        _fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def writing_to(root: Path) -> Iterator[None]:
    """OSErrors of a repository that cannot be written become an answer that says so."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ServiceUnavailable(
                f"the model repository {root} is not there now ({exc.strerror}: "
                f"{exc.filename}); an update is recorded there before it is answered, so "
                "retry once it is back",
                retry_after_s=5,
            ) from None
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT):
            raise ServiceUnavailable(
                f"the model repository {root} cannot be written ({exc.strerror}): live updates "
                "are recorded there so that every worker and restart serves them; mount it "
                "read-write (or switch versions with a new deployment instead)",
                retry_after_s=60,
            ) from None
        raise
