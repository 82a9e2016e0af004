"""One exported ONNX file served without a model repository (the ``model_file`` setting).

The control plane works on a repository (versions, serving state, worker status files), so
the file is given one: a folder in the temporary directory named for the file's absolute
path, so that every gunicorn worker of a server finds the same folder, holding
``<model>/<version>`` as a link to what the exporter wrote:

- ``…/<model>/<N>/model.onnx``, a version directory as ``rlserve export`` writes it (a
  language model's tokenizer files beside it): the model ``<model>``, version ``N``, and the
  link is to that directory;
- any other ``path/to/<model>.onnx``: the model ``<model>``, version 1, and the link is to
  the file.

Serving one file is read-only: live updates and pull mode write to or watch a repository, so
with ``admin_token`` or ``poll_interval_s`` set the server refuses to start.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kernel.errors import ConfigError
from kernel.versions import parse_version
from serve.config import Settings
from serve.control.repository import MODEL_FILE

log = logging.getLogger("rlserve.repository")


@dataclass(frozen=True)
class SingleFile:
    model: str
    version: int
    target: Path  # what <model>/<version> links to: a version directory, or the file
    links_directory: bool


def describe(path: Path) -> SingleFile:
    """The model, version and link target that ``path`` stands for."""
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(
            f"model_file: {path} is not a file; give the path of an exported model.onnx"
        )
    number = parse_version(path.parent.name)
    if path.name == MODEL_FILE and number is not None:
        return SingleFile(path.parent.parent.name, number, path.parent, links_directory=True)
    return SingleFile(path.stem, 1, path, links_directory=False)


def as_repository(settings: Settings) -> Settings:
    """``settings`` as they are, or, with ``model_file`` set, with ``model_repository`` set to
    the file's one-model repository and ``default_model`` to its model."""
    if settings.model_file is None:
        return settings
    _refuse_updates(settings)
    served = describe(settings.model_file)
    root = Path(tempfile.gettempdir()) / f"rlserve-file-{_digest(served.target)}"
    version_dir = root / served.model / str(served.version)
    version_dir.parent.mkdir(parents=True, exist_ok=True)
    if served.links_directory:
        _link(version_dir, served.target)
    else:
        version_dir.mkdir(exist_ok=True)
        _link(version_dir / MODEL_FILE, served.target)
    if "model_repository" in settings.model_fields_set and settings.model_repository != root:
        log.warning(
            "model_file %s is served; model_repository %s is not",
            served.target,
            settings.model_repository,
        )
    return settings.model_copy(update={"model_repository": root, "default_model": served.model})


def _refuse_updates(settings: Settings) -> None:
    for name in ("admin_token", "poll_interval_s"):
        if getattr(settings, name) is not None:
            raise ConfigError(
                f"{name} is set, but model_file {settings.model_file} is served alone and "
                "read-only; live updates need a model repository: export into one "
                "(rlserve export ... --model-repository DIR) and serve it with "
                "--model-repository DIR"
            )


def _digest(target: Path) -> str:
    return hashlib.sha256(str(target).encode()).hexdigest()[:16]


def _link(link: Path, target: Path) -> None:
    """``link`` pointing at ``target``, made atomically (workers may race to make it)."""
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    staged = link.with_name(f".{link.name}.{os.getpid()}")
    staged.unlink(missing_ok=True)
    staged.symlink_to(target, target_is_directory=target.is_dir())
    os.replace(staged, link)
