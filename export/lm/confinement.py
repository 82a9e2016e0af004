"""Links must not lead an export out of the directories it was given.

What a language-model export reads can end up published: the chat template and special
tokens go into the contract (served to anyone by ``GET /v1/models/{model}``), the tokenizer
and generation files are copied beside ``model.onnx``. So before anything is read, every
entry of a directory the export reads from (the checkpoint directory, the base model's
directory) is checked: a symbolic link whose target, fully resolved, is outside the
directory is refused by name. Links that stay inside are fine, and so is a directory that
is itself a link (its resolved path is the root). Files that name other files for
transformers to open (a sharded checkpoint's ``*.index.json`` ``weight_map``, the tokenizer
config's ``fast_tokenizer_files``) must name files inside too.

A Hugging Face hub cache snapshot (``models--org--name/snapshots/<revision>/``) holds links
into its own repository's ``blobs/``; for a snapshot directory those are inside too. The
``blobs/`` directory must be a real directory beside ``snapshots/``, not a link.

The check goes :data:`MAX_DEPTH` levels of subdirectories deep (transformers and peft read
the top level and ``additional_chat_templates/``); a directory with more than
:data:`MAX_ENTRIES` entries within that depth is refused. Hard links cannot be told from
files and are not checked. Files read by the exporter itself (:func:`read_inside`) are
checked again as they are opened, and read without following a link put in their place.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from export.errors import ExportError

MAX_DEPTH = 3
MAX_ENTRIES = 100_000
_HUB_SNAPSHOTS = "snapshots"
_HUB_BLOBS = "blobs"
_INDEXES = "*.index.json"  # sharded weights: weight_map names the shards
_TOKENIZER_CONFIG = "tokenizer_config.json"  # fast_tokenizer_files names tokenizer files


def check_directory(directory: Path, what: str) -> None:
    """Refuse ``directory`` (``what``: how the user gave it) if any entry links outside it,
    or one of its files names a file outside it for transformers to read."""
    _check_links(directory, what)
    _check_named_files(directory, what)


def _check_links(directory: Path, what: str) -> None:
    roots = roots_of(directory)
    pending = [(directory, 0)]
    seen = 0
    while pending:
        folder, depth = pending.pop()
        entries = _entries(folder, what)
        seen += len(entries)
        if seen > MAX_ENTRIES:
            raise ExportError(
                f"{what} {directory}: more than {MAX_ENTRIES} files and folders within "
                f"{MAX_DEPTH} levels; give a directory holding the model's files only"
            )
        for entry in entries:
            if entry.is_symlink():
                _check_link(Path(entry.path), directory, roots, what)
            elif entry.is_dir(follow_symlinks=False) and depth < MAX_DEPTH:
                pending.append((Path(entry.path), depth + 1))


def read_inside(path: Path, directory: Path, what: str) -> bytes:
    """The bytes of ``path``, a regular file that resolves inside ``directory``; a link
    swapped in after the resolution is not followed (the open fails instead)."""
    target = _check_link(path, directory, roots_of(directory), what)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ExportError(f"{path}: cannot be read ({exc.strerror}); did it change?") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ExportError(f"{path}: not a regular file")
        return file.read()


def roots_of(directory: Path) -> tuple[Path, ...]:
    """Where the entries of ``directory`` may resolve to: the directory itself, and for a hub
    cache snapshot also its repository's ``blobs/``."""
    root = directory.resolve()
    blobs = root.parent.parent / _HUB_BLOBS
    if root.parent.name == _HUB_SNAPSHOTS and blobs.is_dir() and not blobs.is_symlink():
        return (root, blobs)
    return (root,)


def _check_named_files(directory: Path, what: str) -> None:
    roots = roots_of(directory)
    for file, key, name in _named_files(directory, what):
        target = (directory / name).resolve()
        if not any(target.is_relative_to(root) for root in roots):
            raise ExportError(
                f"{what} {directory}: {file} names {name!r} ({key}), which is {target}, outside "
                f"the directory; transformers would read it from there, so copy the file into "
                f"{directory} and name it by its file name alone"
            )


def _named_files(directory: Path, what: str) -> Iterator[tuple[str, str, str]]:
    """(file, key, the name it gives) for each file named in the directory's JSON files."""
    for index in sorted(directory.glob(_INDEXES)):
        weight_map = _json(index, directory, what).get("weight_map")
        if isinstance(weight_map, dict):
            for name in sorted({v for v in weight_map.values() if isinstance(v, str)}):
                yield index.name, "weight_map", name
    if (directory / _TOKENIZER_CONFIG).is_file():
        listed = _json(directory / _TOKENIZER_CONFIG, directory, what).get("fast_tokenizer_files")
        for name in listed if isinstance(listed, list) else []:
            if isinstance(name, str):
                yield _TOKENIZER_CONFIG, "fast_tokenizer_files", name


def _json(path: Path, directory: Path, what: str) -> dict[str, Any]:
    """A JSON object (``{}`` when it is not one: the loader says what is wrong with it)."""
    try:
        raw = json.loads(read_inside(path, directory, what))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _entries(folder: Path, what: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as listing:
            return list(listing)
    except OSError as exc:
        raise ExportError(f"{what} {folder}: cannot be listed ({exc.strerror})") from None


def _check_link(path: Path, directory: Path, roots: tuple[Path, ...], what: str) -> Path:
    """The resolved target of ``path``; ExportError when it is outside every root."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of links
        raise ExportError(
            f"{what} {directory}: {_name(path, directory)} is a link that does not resolve "
            f"({exc}); replace it with the file itself"
        ) from None
    if any(target.is_relative_to(root) for root in roots):
        return target
    where = "the directory" if len(roots) == 1 else f"the directory and its hub cache's {roots[1]}"
    raise ExportError(
        f"{what} {directory}: {_name(path, directory)} is a link to {target}, outside "
        f"{where}; an export reads only files inside the directories it is given (what it "
        f"reads is published with the model), so copy {target} into {path.parent} in place "
        "of the link"
    )


def _name(path: Path, directory: Path) -> str:
    try:
        return str(path.relative_to(directory))
    except ValueError:
        return str(path)
