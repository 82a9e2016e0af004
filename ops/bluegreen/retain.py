"""``rlserve rollout retain``: prune old versions from a model repository, safely.

Keeps the newest ``keep`` versions of a model and every version a color serves, read from
the Deployments (annotation ``rlserve.io/model-version`` and env ``RLSERVE_VERSION_POLICY``);
deletes the rest. When it cannot tell what the colors serve, it deletes nothing.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.errors import Conflict, MalformedRequest, NotFound
from kernel.versions import parse_version
from ops.bluegreen.kubectl import Kubectl
from ops.bluegreen.names import MODEL_VERSION, VERSION_POLICY_ENV


@dataclass(frozen=True)
class RetentionPlan:
    kept: list[int]
    referenced: set[int] | None  # None in a dry run: not read
    deleted: list[int]


def retain(k: Kubectl, repository: Path, model: str, keep: int) -> RetentionPlan:
    if keep < 1:
        raise MalformedRequest(f"--keep: {keep} would keep no version; give 1 or more")
    versions = _versions(repository / model)
    selector = f"app={k.names.app}"
    deployments = k.document("get", "deployments", "-l", selector, "-o", "json")
    referenced = None if deployments is None else _referenced(deployments, versions, k)
    newest = versions[-keep:]
    doomed = [v for v in versions if v not in newest and v not in (referenced or set())]
    for version in doomed:
        _delete(k, repository / model / str(version), referenced is None)
    k.say(f"{model}: kept {sorted(set(newest) | (referenced or set()))}, deleted {doomed}")
    return RetentionPlan(newest, referenced, doomed)


def _versions(model_dir: Path) -> list[int]:
    if not model_dir.is_dir():
        raise NotFound(f"--model-repository/--model: {model_dir} is not a directory")
    numbers = (parse_version(p.name) for p in model_dir.iterdir() if p.is_dir())
    return sorted(n for n in numbers if n is not None)


def _delete(k: Kubectl, path: Path, dry_run: bool) -> None:
    if dry_run:
        k.say(f"rm -r {path}  # unless a color references it (not read in a dry run)")
        return
    shutil.rmtree(path)
    k.say(f"deleted {path}")


def _referenced(deployments: dict[str, Any], on_disk: list[int], k: Kubectl) -> set[int]:
    items = deployments.get("items", [])
    if not items:
        raise Conflict(
            f"retain: no Deployments labelled app={k.names.app} in namespace "
            f"{k.names.namespace}; refusing to delete without knowing what the colors serve "
            "(check --namespace)"
        )
    return {v for item in items for v in _served(item, on_disk)}


def _served(deployment: dict[str, Any], on_disk: list[int]) -> set[int]:
    name = deployment.get("metadata", {}).get("name", "?")
    annotated = (deployment.get("metadata", {}).get("annotations") or {}).get(MODEL_VERSION)
    served = {_number(annotated, name, MODEL_VERSION)} if annotated is not None else set()
    return served | _policy_versions(_policy(deployment), on_disk, name)


def _policy(deployment: dict[str, Any]) -> str | None:
    containers = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    env = [e for c in containers or [] for e in c.get("env") or []]
    return next((e.get("value") for e in env if e.get("name") == VERSION_POLICY_ENV), None)


def _policy_versions(text: str | None, on_disk: list[int], name: str) -> set[int]:
    """The versions a version policy loads; no policy means the server's default, latest 1."""
    try:
        policy = json.loads(text) if text else {"latest": 1}
    except json.JSONDecodeError:
        raise Conflict(
            f"retain: deployment/{name} has {VERSION_POLICY_ENV}={text!r}, not JSON; "
            "refusing to delete anything"
        ) from None
    if not isinstance(policy, dict):
        raise Conflict(f"retain: deployment/{name}: {VERSION_POLICY_ENV} is not an object")
    if policy.get("specific") is not None:
        return {_number(v, name, VERSION_POLICY_ENV) for v in policy["specific"]}
    return set(on_disk[-int(policy.get("latest") or 1) :])


def _number(value: Any, name: str, where: str) -> int:
    number = value if isinstance(value, int) else None
    if isinstance(value, str):
        number = parse_version(value)
    if number is not None:
        return number
    raise Conflict(
        f"retain: deployment/{name}: {where} holds {value!r}, not a version number; "
        "refusing to delete anything"
    )
