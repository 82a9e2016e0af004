"""Writing ``DIR/NAME/N/model.onnx`` so that no reader ever sees a half-written version.

The file is written into a temporary directory inside ``DIR/NAME/``, checked there, and the
directory is renamed into place in one step. Versions are immutable: an existing one is
never replaced.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serve.errors import ExportError

MODEL_FILE = "model.onnx"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Destination:
    repository: Path
    name: str
    version: int

    @property
    def model_dir(self) -> Path:
        return self.repository / self.name

    @property
    def version_dir(self) -> Path:
        return self.model_dir / str(self.version)


def destination(repository: Path, name: str, version: int | None) -> Destination:
    """Where the export goes: the given version, or the next free one."""
    if not _NAME.fullmatch(name):
        raise ExportError(
            f"--name {name!r}: use letters, digits, '_', '-' and '.', starting with a letter "
            "or digit (it becomes a directory and a URL path segment)"
        )
    if repository.exists() and not repository.is_dir():
        raise ExportError(f"--model-repository {repository}: is a file; give a directory")
    taken = _versions(repository / name)
    if version is None:
        return Destination(repository, name, max(taken, default=0) + 1)
    if version < 1:
        raise ExportError(f"--version {version}: versions are integers from 1")
    if version in taken:
        raise ExportError(
            f"--version {version}: {repository / name / str(version)} already exists and "
            f"versions are never overwritten; omit --version for the next free one "
            f"({max(taken) + 1})"
        )
    return Destination(repository, name, version)


def write(dest: Destination, data: bytes, check: Callable[[Path], None]) -> Path:
    """Write, ``check`` the file in its temporary place, then rename the version into place."""
    created = not dest.model_dir.exists()
    dest.model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest.model_dir))
    try:
        _write_file(staging / MODEL_FILE, data)
        check(staging / MODEL_FILE)
        staging.chmod(0o755)  # mkdtemp makes it private; readers (the server) need to list it
        _rename(staging, dest.version_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(dest.model_dir.iterdir()):
            dest.model_dir.rmdir()
        raise
    return dest.version_dir / MODEL_FILE


def _versions(model_dir: Path) -> set[int]:
    if not model_dir.is_dir():
        return set()
    return {int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()}


def _write_file(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _rename(staging: Path, target: Path) -> None:
    try:
        os.rename(staging, target)
    except OSError as exc:
        raise ExportError(
            f"{target}: could not move the new version into place ({exc.strerror}); another "
            "export may have taken this version at the same time; export again"
        ) from None
