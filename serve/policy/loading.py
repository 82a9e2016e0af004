"""Loading a policy version (kind ``actor_critic``): its contract, features view, golden
vectors and warm-up.

The contract is read from the session's metadata; a features view (the version's own
``features.yaml``, else its model's) must build this version's observations
(:func:`check_view`); the golden vectors must reproduce; then every padded batch size runs
once. Any failure is a ModelLoadError (a ContractError) saying which step and why.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kernel import contract
from kernel.contract import PolicyContract
from kernel.errors import ConfigError, ContractError, ModelLoadError
from kernel.spaces import Box, Dict, Leaf, Space
from serve.batching.plan import buckets_for
from serve.config import FeatureView, ModelSettings, Settings, load_version_view
from serve.plugins import VersionFiles
from serve.policy.version import PolicyVersion, action_session

log = logging.getLogger("rlserve.repository")

VERSION_VIEW = "features.yaml"  # beside a version's model.onnx: its own features view


def load(files: VersionFiles, settings: Settings, model: ModelSettings) -> PolicyVersion:
    """A policy version from its opened model file."""
    name, version, path, session, digest = (
        files.name, files.version, files.path, files.session, files.sha256
    )  # fmt: skip
    origin = f"{name}/{version}"
    started = files.started
    policy_contract = contract.from_metadata(session.metadata, origin)
    own_view = _own_view(path, origin)
    view = own_view or model.features
    if view is not None:
        check_view(view, policy_contract, origin)
    problems = contract.check_golden(policy_contract, session.run)
    if problems:
        raise ModelLoadError(f"{origin}: golden vectors do not reproduce: {'; '.join(problems)}")
    loaded = PolicyVersion(
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
