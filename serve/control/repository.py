"""The model repository on disk, in Triton's layout, and loading one version from it.

    <repository>/<model>/config.yaml          optional: batching, deadline, version policy
    <repository>/<model>/<version>/model.onnx  integer versions
    <repository>/<model>/<version>/features.yaml  optional: the version's own features view

A version directory counts only once its ``model.onnx`` exists; the exporter writes a
version into a hidden temporary directory and renames it into place, so a reader never
sees half a version. Names starting with ``.`` are ignored.

Loading a version reads its bytes once (sha256), builds the onnxruntime session, reads the
policy contract from the session's metadata, re-runs the golden vectors and warms every
padded batch size; any failure is a ModelLoadError saying which step and why.

What a version is and how it loads is its kind's (``serve.plugins``): the contract's kind
in the file's metadata picks the plug-in that loads it, and a model's kind is told from its
newest version's folder before any version loads (:func:`model_kind`; a language model's
folder holds its tokenizer).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from kernel import contract
from kernel.errors import ConfigError, ModelLoadError
from kernel.versions import parse_version
from serve.config import (
    ModelSettings,
    Settings,
    VersionPolicy,
)
from serve.dataplane.kinds import ModelKind
from serve.dataplane.model import ServedModel
from serve.execution.runtime import create_session
from serve.plugins import VersionFiles, kind_of_folder, plugin_for_contract

log = logging.getLogger("rlserve.repository")

MODEL_FILE = "model.onnx"
MODEL_CONFIG = "config.yaml"


@dataclass(frozen=True)
class VersionDir:
    model: str
    version: int
    path: Path  # the model.onnx


def discover(root: Path) -> dict[str, list[VersionDir]]:
    """Every model and its complete versions, ascending."""
    if not root.is_dir():
        raise ConfigError(
            f"model_repository: {root} is not a directory; give a folder laid out as "
            "<model>/<version>/model.onnx"
        )
    found: dict[str, list[VersionDir]] = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and _visible(p)):
        found[model_dir.name] = versions_of(model_dir)
    return found


def versions_of(model_dir: Path) -> list[VersionDir]:
    """The complete versions of a model, ascending; a directory whose name is not a version
    number is skipped (``skipped_in`` names them)."""
    versions = []
    for d in model_dir.iterdir():
        number = parse_version(d.name)
        if number is not None and d.is_dir() and (d / MODEL_FILE).is_file():
            versions.append(VersionDir(model_dir.name, number, d / MODEL_FILE))
    return sorted(versions, key=lambda v: v.version)


def skipped_in(root: Path) -> list[Path]:
    """Directories of the repository's models whose names are not version numbers (nor
    hidden): what a version policy can never select."""
    return sorted(
        d
        for model_dir in root.iterdir()
        if model_dir.is_dir() and _visible(model_dir)
        for d in model_dir.iterdir()
        if d.is_dir() and _visible(d) and parse_version(d.name) is None
    )


def select(versions: list[VersionDir], policy: VersionPolicy) -> list[VersionDir]:
    """The versions a policy asks for: the newest N, or the listed ones that exist."""
    if policy.specific is not None:
        wanted = set(policy.specific)
        return [v for v in versions if v.version in wanted]
    return versions[-(policy.latest or 1) :]


def load_version(where: VersionDir, settings: Settings, model: ModelSettings) -> ServedModel:
    return load_file(where.model, where.version, where.path, settings, model)


def load_file(
    name: str,
    version: int,
    path: Path,
    settings: Settings,
    model: ModelSettings,
    sha256: str | None = None,
) -> ServedModel:
    """A model version from its ONNX file: session, contract, golden vectors, warm-up.
    onnxruntime reads the file itself (handing it the bytes would copy them while holding
    the interpreter lock: tens of milliseconds per 100 MB on the event loop's back)."""
    origin = f"{name}/{version}"
    started = time.monotonic()
    digest = sha256 or file_sha256(path, origin)
    session = create_session(path, settings, origin)
    files = VersionFiles(name, version, path, session, digest, started)
    return plugin_for_contract(contract.kind_of(session.metadata)).load(files, settings, model)


def model_kind(versions: list[VersionDir]) -> ModelKind:
    """What a model's versions are, told before any is loaded: the newest decides (a
    language model's directory holds a tokenizer: serve.plugins)."""
    return kind_of_folder(versions[-1].path.parent if versions else None)


def file_sha256(path: Path, origin: str) -> str:
    """The file's sha256, read in blocks (hashing a block lets other threads run)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    except OSError as exc:
        raise ModelLoadError(f"{origin}: cannot read {path} ({exc.strerror})") from None
    return digest.hexdigest()


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")
