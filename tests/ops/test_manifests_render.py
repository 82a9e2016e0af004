"""Every overlay renders with `kubectl kustomize` and is valid Kubernetes (1.29 and 1.33)."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from tests.ops.conftest import K8S, OVERLAYS, render
from tests.ops.ops_manifests import named, of_kind

# Custom resources whose schemas kubernetes-validate does not ship. The Prometheus
# Operator's PodMonitor is checked by the invariant tests instead (selector, port, path).
CUSTOM_RESOURCES = {"PodMonitor"}


def test_there_is_a_gpu_and_a_cpu_overlay():
    assert {"production", "cpu-dev"} <= set(OVERLAYS)


@pytest.mark.parametrize("version", ["1.29", "1.33"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_validates_strictly_against_the_kubernetes_schemas(overlay, version):
    problems = []
    for doc in render(overlay):
        if doc["kind"] in CUSTOM_RESOURCES:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            problems.append(f"{doc['kind']}/{doc['metadata']['name']} {where}: {exc.message}")
    assert problems == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_known_custom_resources_skip_schema_validation(overlay):
    builtin = {d["kind"] for d in render(overlay)} - CUSTOM_RESOURCES
    for doc in render(overlay):
        if doc["kind"] in builtin:
            kubernetes_validate.validate(doc, "1.33", strict=True)  # raises if no schema


def test_the_argo_rollout_is_optional_and_reuses_the_base_objects():
    rollout = yaml.safe_load((K8S / "optional/argo-rollouts/rollout.yaml").read_text())
    docs = render("production")
    assert all(d["kind"] != "Rollout" for o in OVERLAYS for d in render(o))
    strategy = rollout["spec"]["strategy"]["blueGreen"]
    named(docs, "Service", strategy["activeService"])
    named(docs, "Service", strategy["previewService"])
    workload = named(docs, "Deployment", rollout["spec"]["workloadRef"]["name"])
    assert rollout["spec"]["selector"] == workload["spec"]["selector"]
    assert strategy["autoPromotionEnabled"] is False


def test_the_models_come_from_a_read_only_nfs_volume_in_production():
    docs = render("production")
    (volume,) = of_kind(docs, "PersistentVolume")
    (claim,) = of_kind(docs, "PersistentVolumeClaim")
    assert volume["spec"]["accessModes"] == ["ReadOnlyMany"] == claim["spec"]["accessModes"]
    assert volume["spec"]["nfs"]["readOnly"] is True
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
