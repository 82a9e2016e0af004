"""Writing ``DIR/NAME/N/`` so that no reader ever sees a half-written version.

The files (``model.onnx``; for a language model its tokenizer files beside it) are written
into a temporary directory inside ``DIR/NAME/``, checked there, and the directory is renamed
into place in one step. Versions are immutable: an existing one is
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

from export.errors import ExportError

MODEL_FILE = "model.onnx"
MAX_NAME_CHARACTERS = 128  # a directory name (255 bytes at most), a URL path segment, a label
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME_CHARACTERS - 1}}}")
NAME_RULE = (
    f"1 to {MAX_NAME_CHARACTERS} letters, digits, '_', '-' and '.', starting with a letter or "
    "digit (it becomes a directory and a URL path segment)"
)


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
        given = f"{name[:20]!r}... ({len(name)} characters)" if len(name) > 40 else repr(name)
        raise ExportError(f"--name {given}: a model name is {NAME_RULE}")
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

    def fill(staging: Path) -> None:
        _write_file(staging / MODEL_FILE, data)

    write_version(dest, fill, lambda staging: check(staging / MODEL_FILE))
    return dest.version_dir / MODEL_FILE


def write_version(
    dest: Destination, fill: Callable[[Path], None], check: Callable[[Path], None]
) -> Path:
    """A version of several files: ``fill`` writes them into a staging directory, every file
    is synced to disk, ``check`` inspects the directory, and it is renamed into place in one
    step. Returns the version directory; on any failure nothing is left behind."""
    created = not dest.model_dir.exists()
    dest.model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest.model_dir))
    try:
        fill(staging)
        _sync_files(staging)
        check(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; readers (the server) need to list it
        _rename(staging, dest.version_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(dest.model_dir.iterdir()):
            dest.model_dir.rmdir()
        raise
    return dest.version_dir


def _versions(model_dir: Path) -> set[int]:
    if not model_dir.is_dir():
        return set()
    return {int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()}


def _write_file(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sync_files(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def _rename(staging: Path, target: Path) -> None:
    try:
        os.rename(staging, target)
    except OSError as exc:
        raise ExportError(
            f"{target}: could not move the new version into place ({exc.strerror}); another "
            "export may have taken this version at the same time; export again"
        ) from None
