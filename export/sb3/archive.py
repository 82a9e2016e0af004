"""The checkpoint's zip, size-checked before anything in it is inflated.

``model.save()`` writes a handful of entries, stored uncompressed: ``data`` (the settings as
JSON, a few KB to a few MB), the torch state dicts and two short text files. A zip whose
entries would inflate far beyond that is not one it wrote — a zip bomb makes a 1 MB file
inflate to gigabytes — and is refused from its central directory, before any entry is read.

Rules, in order (the limits are well above any checkpoint ``model.save()`` writes):

1. at most :data:`MAX_ENTRIES` entries;
2. ``data`` inflates to at most :data:`MAX_SETTINGS_BYTES`;
3. all entries together inflate to at most :data:`MAX_RATIO` times the file's own size plus
   :data:`SLACK_BYTES` (a stored zip is about its own size; a re-compressed one a few times).

The sizes are the zip's declared ones; Python's zipfile never inflates an entry past its
declared size (a lying header ends in a CRC error instead).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import IO, Any

from export.errors import ExportError
from kernel.errors import one_line

SETTINGS_ENTRY = "data"
MAX_ENTRIES = 64
MAX_SETTINGS_BYTES = 64 << 20
MAX_RATIO = 20
SLACK_BYTES = 64 << 20
_EXPECTED = "give the .zip written by model.save()"


def settings(file: IO[bytes], path: Path) -> dict[str, Any]:
    """The checkpoint's ``data`` entry as JSON (serialized entries still encoded)."""
    try:
        with zipfile.ZipFile(file) as archive:
            entries = archive.infolist()
            _check_sizes(entries, _file_size(file), path)
            if SETTINGS_ENTRY not in archive.namelist():
                raise ExportError(
                    f"{path}: the zip has no Stable-Baselines3 'data' entry; {_EXPECTED}"
                )
            text = archive.read(SETTINGS_ENTRY).decode("utf-8")
        raw = json.loads(text)
    except ExportError:
        raise
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError, ValueError, EOFError) as exc:
        raise ExportError(
            f"{path}: not a readable Stable-Baselines3 checkpoint ({one_line(exc, 200)}); "
            f"{_EXPECTED}"
        ) from None
    if not isinstance(raw, dict):
        raise ExportError(f"{path}: the zip's 'data' entry is not a JSON object; {_EXPECTED}")
    return raw


def _check_sizes(entries: list[zipfile.ZipInfo], file_size: int, path: Path) -> None:
    if len(entries) > MAX_ENTRIES:
        raise ExportError(
            f"{path}: the zip holds {len(entries):,} entries; a Stable-Baselines3 checkpoint "
            f"holds a handful (at most {MAX_ENTRIES} are read); {_EXPECTED}"
        )
    for entry in entries:
        if entry.filename == SETTINGS_ENTRY and entry.file_size > MAX_SETTINGS_BYTES:
            raise ExportError(
                f"{path}: the zip's 'data' entry would inflate to {_size(entry.file_size)} "
                f"(at most {_size(MAX_SETTINGS_BYTES)} are read; model.save() writes a few "
                f"MB at most); refusing to inflate it; {_EXPECTED}"
            )
    total = sum(entry.file_size for entry in entries)
    limit = MAX_RATIO * file_size + SLACK_BYTES
    if total > limit:
        largest = max(entries, key=lambda entry: entry.file_size)
        raise ExportError(
            f"{path}: the zip's entries would inflate to {_size(total)} from a "
            f"{_size(file_size)} file ({largest.filename!r} alone to "
            f"{_size(largest.file_size)}; at most {_size(limit)} are read for a file this "
            f"size); refusing to inflate them; {_EXPECTED}"
        )


def _file_size(file: IO[bytes]) -> int:
    position = file.tell()
    size = file.seek(0, 2)
    file.seek(position)
    return size


def _size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count} bytes"
