"""A push by path: the files a client names inside the model repository, opened without
following links and copied within the push's size limit.

A client names a file relative to the repository (``{"path": "cartpole/7/model.onnx"}``).
Nothing outside the repository is ever read because a client said so: the path is walked
from the repository's root one folder at a time, each opened with ``O_NOFOLLOW`` (a
symbolic link on the way, even one that points inside, is refused, as is ``..``), and the
file itself must be a regular file, opened the same way. A file named ``model.onnx`` brings
the files of its folder along (a language model's tokenizer, a version's features view);
each of them must be a regular file too, and a link, folder, pipe, socket or device beside
it is refused by name. Every file is opened and measured before anything is copied: each
and all together must fit in ``max_model_bytes``, and the copy stops at the same bound
should a file grow meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kernel.errors import InvalidInput, PayloadTooLarge, listed, quoted
from serve.control import store
from serve.control.repository import MODEL_FILE

PATH_BYTES = 4096  # PATH_MAX: the longest path Linux opens
NAME_BYTES = 255  # NAME_MAX: the longest name of one file or folder
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a pipe never blocks it
_STAGED = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_BLOCK = 1 << 20
EXAMPLE = "'cartpole/7/model.onnx'"


@dataclass(frozen=True)
class OpenFile:
    """A regular file of the repository, opened: its name in the staged version, its size."""

    name: str
    fd: int
    size: int


def stage(root: Path, model: str, version: int, path: str, limit: int) -> Path:
    """Copy the file ``path`` names inside ``root`` (and, for a ``model.onnx``, the files
    beside it) into a new staging folder of the model; the staged model file's path.
    InvalidInput for a path that is malformed or names anything but regular files inside
    the repository; PayloadTooLarge when they exceed ``limit`` bytes."""
    parts = _parts(path)
    with _opened(root, parts, path) as files:
        _check_total(files, path, limit)
        folder = store.staging(root, model, version)
        try:
            with store.writing_to(root):
                budget = limit
                for file in files:
                    budget -= _copy(file, folder, path, budget)
        except BaseException:
            store.discard(folder / MODEL_FILE)
            raise
    return folder / MODEL_FILE


# ---------------------------------------------------------------------- the path


def _parts(path: str) -> list[str]:
    """The names along ``path``, checked: relative, no ``..``, no NUL, within Linux's limits."""
    if "\x00" in path:
        raise _malformed(path, "holds a NUL character")
    try:
        size = len(os.fsencode(path))
    except UnicodeError:
        raise _malformed(path, "is not valid text for a file name") from None
    if size > PATH_BYTES:
        raise _malformed(path, f"is {size:,} bytes long; a path is at most {PATH_BYTES}")
    if path.startswith("/"):
        raise _malformed(path, "is absolute")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        raise _malformed(path, "names no file")
    if ".." in parts:
        raise _malformed(path, "goes up with '..'")
    longest = max(len(os.fsencode(part)) for part in parts)
    if longest > NAME_BYTES:
        raise _malformed(path, f"has a name of {longest:,} bytes; a name is at most {NAME_BYTES}")
    return parts


def _malformed(path: str, why: str) -> InvalidInput:
    return InvalidInput(
        f"path: {quoted(path)} {why}; name a file inside the model repository, relative to "
        f"it, like {EXAMPLE}"
    )


# ---------------------------------------------------------------------- opening


@contextlib.contextmanager
def _opened(root: Path, parts: list[str], path: str) -> Iterator[list[OpenFile]]:
    """The named file first (as ``model.onnx``), then for a ``model.onnx`` every file beside
    it; all closed on the way out."""
    files: list[OpenFile] = []
    try:
        folder = _folder(root, parts[:-1], path)
        try:
            files.append(_regular(folder, parts[-1], MODEL_FILE, path))
            if parts[-1] == MODEL_FILE:
                files.extend(_beside(folder, path))
        finally:
            os.close(folder)
        yield files
    finally:
        for file in files:
            os.close(file.fd)


def _folder(root: Path, names: list[str], path: str) -> int:
    """The folder that holds the named file, opened one step at a time from the root (the
    operator's setting, whose own links are followed), never through a link."""
    with store.writing_to(root):
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for name in names:
        try:
            kind = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if not stat.S_ISDIR(kind):
                raise InvalidInput(f"path: {quoted(path)}: {quoted(name)} {_not_a_folder(kind)}")
            inner = os.open(name, _FOLDER, dir_fd=fd)
        except OSError as exc:
            raise _refused(path, quoted(name), exc) from None
        finally:
            os.close(fd)
        fd = inner
    return fd


def _regular(folder: int, name: str, staged_as: str, path: str) -> OpenFile:
    """``name`` in ``folder``, opened without following a link; InvalidInput unless it is a
    regular file (told before opening, and again of what was opened)."""
    try:
        before = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if not stat.S_ISREG(before.st_mode):
            raise InvalidInput(
                f"path: {quoted(path)}: {quoted(name)} {_not_a_file(before.st_mode)}"
            )
        fd = os.open(name, _FILE, dir_fd=folder)
    except OSError as exc:
        raise _refused(path, quoted(name), exc) from None
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or opened.st_ino != before.st_ino:
        os.close(fd)
        raise InvalidInput(f"path: {quoted(path)}: {quoted(name)} changed while it was opened")
    return OpenFile(staged_as, fd, opened.st_size)


def _beside(folder: int, path: str) -> list[OpenFile]:
    """Every file beside ``model.onnx``, opened; InvalidInput naming all that are not
    regular files, before any is copied."""
    files: list[OpenFile] = []
    others = sorted(name for name in os.listdir(folder) if name != MODEL_FILE)
    refused = [name for name in others if not _is_regular(folder, name)]
    try:
        if refused:
            raise InvalidInput(
                f"path: {quoted(path)}: beside it, {listed(refused)} "
                f"{'is' if len(refused) == 1 else 'are'} not regular files (a link, folder, "
                "pipe, socket or device); a push by path copies only the regular files of a "
                "version's folder, so remove them from it"
            )
        for name in others:
            files.append(_regular(folder, name, name, path))
    except BaseException:
        for file in files:
            os.close(file.fd)
        raise
    return files


def _is_regular(folder: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _not_a_folder(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "is a symbolic link; a push by path follows no link, name the folder itself"
    return "is not a folder"


def _not_a_file(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "is a symbolic link; a push by path copies no link's target, name the file itself"
    return "is not a regular file"


def _refused(path: str, what: str, exc: OSError) -> InvalidInput:
    return InvalidInput(
        f"path: {quoted(path)}: {what} cannot be opened ({exc.strerror}); name a regular file "
        f"inside the model repository, like {EXAMPLE}"
    )


# ---------------------------------------------------------------------- copying


def _check_total(files: list[OpenFile], path: str, limit: int) -> None:
    total = sum(file.size for file in files)
    if total > limit:
        sizes = listed([f"{file.name}: {file.size:,} bytes" for file in files])
        raise PayloadTooLarge(
            f"path: {quoted(path)}: the files to copy come to {total:,} bytes {sizes}, over "
            f"max_model_bytes ({limit:,}); push a smaller version or raise the limit"
        )


def _copy(file: OpenFile, folder: Path, path: str, limit: int) -> int:
    """``file`` into ``folder``, in the kernel, stopping once it is over ``limit`` bytes
    (what is left of the push's limit); the bytes copied."""
    target = os.open(folder / file.name, _STAGED, 0o644)
    try:
        copied = 0
        while sent := os.sendfile(target, file.fd, copied, min(_BLOCK, limit + 1 - copied)):
            copied += sent
            if copied > limit:
                raise PayloadTooLarge(
                    f"path: {quoted(path)}: {quoted(file.name)} grew past max_model_bytes "
                    "while it was copied; push it once it is written"
                )
    finally:
        os.close(target)
    return copied
