"""Lookups in rendered manifests, for the invariant tests."""

from __future__ import annotations

from typing import Any

import yaml

Doc = dict[str, Any]


def of_kind(docs: tuple[Doc, ...], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    (found,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def pod_spec(workload: Doc) -> Doc:
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return workload["spec"]["template"]["spec"]


def server(deployment: Doc) -> Doc:
    (container,) = [c for c in pod_spec(deployment)["containers"] if c["name"] == "server"]
    return container


def env(deployment: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in server(deployment)["env"]}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(deployment: Doc) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def config(docs: tuple[Doc, ...]) -> Doc:
    """The server's config.yaml, from the generated (content-hashed) ConfigMap."""
    (config_map,) = [d for d in of_kind(docs, "ConfigMap") if "config.yaml" in d["data"]]
    return yaml.safe_load(config_map["data"]["config.yaml"])


def port_named(container: Doc, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)
