"""The files an export reads: existence checks that say what to give, and checksums."""

from __future__ import annotations

import hashlib
from pathlib import Path

from export.errors import ExportError

_CHUNK = 1 << 20


def require_file(path: Path, what: str, expected: str) -> Path:
    """``path`` when it is a readable file; otherwise an ExportError naming what to give."""
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "no such file"
        raise ExportError(f"{what} {path}: {problem}; give {expected}")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
