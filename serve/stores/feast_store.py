"""A Feast feature repository as a model's feature store (``store: feast:///path``).

Feast's SDK (``pip install 'feast[redis]'``; never imported by a server without such a
view) reads the repository's ``feature_store.yaml`` and registry, and its online store
(Redis, as teams usually run it). One ``FeatureStore`` per repository path serves the
process: opened when a version with the view loads (:func:`check`, off the event loop,
where the SDK's import and the registry's first read are paid) and shared by the lookup
link's thread (:func:`opened`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernel.errors import ContractError
from serve.config import FEAST_SCHEME, FeatureView

_stores: dict[str, Any] = {}  # repository path -> feast.FeatureStore
_lock = threading.Lock()


def opened(url: str) -> Any:
    """The repository's FeatureStore, opened once per process."""
    path = url[len(FEAST_SCHEME) :]
    with _lock:
        store = _stores.get(path)
        if store is None:
            with _environment_kept(_PROMETHEUS):
                from feast import FeatureStore

                store = _stores[path] = FeatureStore(repo_path=path)
        return store


# Feast's SDK points prometheus_client's multiprocess mode at a folder of its own when it is
# imported, which would take over the server's /metrics: what it sets there is undone.
_PROMETHEUS = ("PROMETHEUS_MULTIPROC_DIR", "PROMETHEUS_MULTIPROCESS_DIR")


@contextlib.contextmanager
def _environment_kept(names: tuple[str, ...]) -> Iterator[None]:
    kept = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in kept.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check(view: FeatureView, origin: str) -> None:
    """The repository opens, and every feature of the view is in its registry under the
    view's entity (ContractError naming what is not)."""
    path = Path(view.store[len(FEAST_SCHEME) :])
    if not (path / "feature_store.yaml").is_file():
        raise ContractError(
            f"{origin}: features store {view.store}: no feature_store.yaml in {path}; give the "
            "folder of the Feast feature repository"
        )
    try:
        store = opened(view.store)
        views = {v.name: v for v in store.list_feature_views()}
    except Exception as exc:  # Feast raises its own types for a bad repository
        raise ContractError(f"{origin}: the Feast repository {path} does not open: {exc}") from None
    for feature in view.columns:
        name, _, field = feature.partition(":")
        found = views.get(name)
        if found is None:
            raise ContractError(
                f"{origin}: features: {feature!r} names the feature view {name!r}, which the "
                f"Feast repository does not have (it has {sorted(views)}); run feast apply"
            )
        fields = [f.name for f in found.features]
        if field not in fields:
            raise ContractError(
                f"{origin}: features: {feature!r}: the feature view {name!r} has {fields}"
            )
        keys = list(found.join_keys) if hasattr(found, "join_keys") else list(found.entities)
        if view.entity not in keys:
            raise ContractError(
                f"{origin}: features: the view's entity {view.entity!r} is not a join key of "
                f"the feature view {name!r} (its join keys: {keys})"
            )
