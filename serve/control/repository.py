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

A language-model version (contract kind ``causal-lm``) also holds its tokenizer beside
``model.onnx``; it loads as a :class:`~serve.lm.model.LanguageModel` (golden prompts
decoded again instead of golden vectors), and its model is served by the continuous-batching
scheduler (:func:`model_kind` tells which, before any version is loaded).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from kernel import contract
from kernel.contract import PolicyContract
from kernel.errors import ConfigError, ContractError, ModelLoadError
from kernel.lm import contract as lm_contract
from kernel.spaces import Box, Dict, Leaf, Space
from kernel.versions import parse_version
from serve.actor_critic.policy import ActorCriticPolicy, action_session
from serve.batching.plan import buckets_for
from serve.config import (
    FeatureView,
    ModelSettings,
    Settings,
    VersionPolicy,
    load_version_view,
)
from serve.dataplane.kinds import ModelKind
from serve.dataplane.model import ServedModel
from serve.execution.runtime import Session, create_session
from serve.lm.model import LanguageModel

log = logging.getLogger("rlserve.repository")

MODEL_FILE = "model.onnx"
MODEL_CONFIG = "config.yaml"
VERSION_VIEW = "features.yaml"  # beside a version's model.onnx: its own features view


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


FLOATS = ("float16", "float32", "float64")


def check_view(view: FeatureView, policy: PolicyContract, origin: str) -> None:
    """A feature view builds this version's observations: one 1-D float Box of as many
    values as the view has features, or for a view by observation key, a Dict space of
    those keys, each such a Box (ContractError naming the mismatch)."""
    space = policy.observation_space
    if view.parts:
        _check_keys(view, space, origin)
    else:
        _check_flat(space, view.columns, origin, "")
    if view.feast:
        from serve.stores import feast_store

        feast_store.check(view, origin)


def _check_keys(view: FeatureView, space: Space, origin: str) -> None:
    keys = [key for key, _ in view.parts]
    if not isinstance(space, Dict):
        raise ContractError(
            f"{origin}: the features view lists features by observation key ({keys}), but this "
            f"version observes {_shown(space)}; list its features flat, in the observation's "
            "order"
        )
    if set(keys) != set(space.spaces):
        raise ContractError(
            f"{origin}: the features view lists features for the observation keys "
            f"{sorted(keys)}, but this version's Dict space has {sorted(space.spaces)}; list "
            "each key's features"
        )
    for key, names in view.parts:
        _check_flat(space.spaces[key], names, origin, f" {key!r}")


def _check_flat(space: Space | Leaf, names: list[str], origin: str, key: str) -> None:
    if not isinstance(space, Box) or len(space.shape) != 1 or space.dtype not in FLOATS:
        raise ContractError(
            f"{origin}: the model's features view builds a flat float observation{key} (a "
            f"1-D float Box) from {len(names)} features, but this version observes "
            f"{_shown(space)}; serve it without features, or export a policy over flat vectors"
        )
    if space.shape[0] != len(names):
        raise ContractError(
            f"{origin}: the features view lists {len(names)} features{' for' + key if key else ''} "
            f"({names}), but this version's observation{key} has {space.shape[0]} values; "
            "list one feature per value, in the observation's order"
        )


def _shown(space: Space | Leaf) -> str:
    return space.model_dump_json()[:160]


def _own_view(path: Path, origin: str) -> FeatureView | None:
    """The features view in the version's folder (``features.yaml``), if it has one."""
    try:
        return load_version_view(path.parent / VERSION_VIEW)
    except ConfigError as exc:
        raise ModelLoadError(f"{origin}: {exc}") from None


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
    if contract.kind_of(session.metadata) == lm_contract.KIND:
        return _load_language_model(name, version, path, session, digest, model, started)
    policy_contract = contract.from_metadata(session.metadata, origin)
    own_view = _own_view(path, origin)
    view = own_view or model.features
    if view is not None:
        check_view(view, policy_contract, origin)
    problems = contract.check_golden(policy_contract, session.run)
    if problems:
        raise ModelLoadError(f"{origin}: golden vectors do not reproduce: {'; '.join(problems)}")
    loaded = ActorCriticPolicy(
        name,
        version,
        policy_contract,
        session,
        digest,
        model.max_batch_size,
        observation_bounds=model.observation_bounds,
        features=own_view,
        actions=action_session(path, policy_contract, session, settings, origin),
    )
    timings = loaded.warm_up(buckets_for(model.max_batch_size))
    log.info(
        "loaded %s on %s in %.2fs (golden vectors OK; warmed batch sizes, ms: %s)",
        origin,
        loaded.provider,
        time.monotonic() - started,
        ", ".join(f"{size}: {s * 1000:.3g}" for size, s in timings.items()),
    )
    return loaded


def _load_language_model(
    name: str,
    version: int,
    path: Path,
    session: Session,
    digest: str,
    model: ModelSettings,
    started: float,
) -> ServedModel:
    loaded = LanguageModel.load(name, version, path.parent, session, digest)
    timings = loaded.warm_up(buckets_for(model.max_sequences))
    log.info(
        "loaded %s (language model) on %s in %.2fs (golden prompts OK; one step, ms: %s)",
        f"{name}/{version}",
        loaded.provider,
        time.monotonic() - started,
        ", ".join(f"{size}: {s * 1000:.3g}" for size, s in timings.items()),
    )
    # A language model sits in a model's lifecycle as actor-critic versions do; what the
    # predict path would ask of it, it refuses (serve.lm.model). ServedModel's contract is
    # an actor-critic's: the cast says so until that protocol names both kinds.
    return cast(ServedModel, loaded)


def model_kind(versions: list[VersionDir]) -> ModelKind:
    """What a model's versions are, told before any is loaded: the newest decides (a
    language model's directory holds a tokenizer)."""
    if versions and (versions[-1].path.parent / lm_contract.TOKENIZER_FILE).is_file():
        return ModelKind.GENERATIONS
    return ModelKind.ROWS


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
