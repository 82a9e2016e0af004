"""The shared-GPU overlay (k8s/overlays/gpu-shared): the device plugin's sharing configs, the
shared resource the servers request, replicas per GPU, and the GPU memory budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from serve import config as server_config
from serve.execution import runtime
from tests.ops.conftest import K8S, OVERLAYS, render, render_path
from tests.ops.ops_manifests import Doc, config, env, named, of_kind, pod_spec, server

OVERLAY = "gpu-shared"
DEVICE_PLUGIN = K8S / "overlays" / OVERLAY / "device-plugin"
WHOLE_GPU, SHARED_GPU = "nvidia.com/gpu", "nvidia.com/gpu.shared"
COLORS = ("blue", "green")
MIB = 1 << 20
# What a worker process holds on the GPU outside onnxruntime's arena (the CUDA context,
# cuBLAS/cuDNN handles): the allowance config.yaml's budget and docs/gpu-sharing.md use.
CUDA_CONTEXT_MIB = 512

# The device plugin's config file, format v1 (NVIDIA/k8s-device-plugin, api/config/v1): the
# keys it reads at each level, and the values GPU feature discovery then labels nodes with
# (nvidia.com/gpu.sharing-strategy).
TOP_LEVEL = {"version", "flags", "sharing", "resources", "imex"}
STRATEGIES = {"timeSlicing": "time-slicing", "mps": "mps"}
REPLICATED = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}
RESOURCE = {"name", "rename", "devices", "replicas"}


def deployments() -> list[Doc]:
    return [named(render(OVERLAY), "Deployment", f"rlserve-{c}") for c in COLORS]


def plugin_configs() -> dict[str, dict[str, Any]]:
    """The device plugin's configs by name (the ConfigMap's keys), parsed."""
    (config_map,) = of_kind(render_path(DEVICE_PLUGIN), "ConfigMap")
    return {name: yaml.safe_load(text) for name, text in config_map["data"].items()}


def sharing(plugin_config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(GFD's name of the strategy, its replicated-resources block), checking the format."""
    assert plugin_config["version"] == "v1"
    assert set(plugin_config) <= TOP_LEVEL
    (strategy,) = plugin_config["sharing"]  # time-slicing and MPS are mutually exclusive
    assert strategy in STRATEGIES
    replicated = plugin_config["sharing"][strategy]
    assert set(replicated) <= REPLICATED
    assert replicated["resources"], "a strategy without resources shares nothing"
    for resource in replicated["resources"]:
        assert set(resource) <= RESOURCE
        assert isinstance(resource["replicas"], int)
    return STRATEGIES[strategy], replicated


def advertised(replicated: dict[str, Any]) -> dict[str, int]:
    """The resource names a node then advertises, with the replicas of each GPU."""
    names = {}
    for resource in replicated["resources"]:
        name = resource.get("rename") or (
            resource["name"] + ".shared" if replicated.get("renameByDefault") else resource["name"]
        )
        names[name] = resource["replicas"]
    return names


def node_terms(deployment: Doc) -> dict[str, dict[str, Any]]:
    (term,) = pod_spec(deployment)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return {e["key"]: e for e in term["matchExpressions"]}


def replicas_per_gpu() -> int:
    """The one replicas count of every config (what the pods are sized for)."""
    counts = {n for c in plugin_configs().values() for n in advertised(sharing(c)[1]).values()}
    (count,) = counts
    return count


def test_the_overlay_is_rendered_and_validated_with_the_others():
    assert OVERLAY in OVERLAYS  # so test_manifests_render validates it on 1.29 and 1.33


@pytest.mark.parametrize("version", ["1.29", "1.33"])
def test_the_device_plugin_config_map_validates_and_takes_the_namespace_it_is_applied_to(
    version,
):
    docs = render_path(DEVICE_PLUGIN)
    assert [d["kind"] for d in docs] == ["ConfigMap"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
        assert "namespace" not in doc["metadata"], "applied with -n <the device plugin's>"
        assert doc["metadata"]["name"] == "rlserve-gpu-sharing", "no hash: the plugin names it"


def test_there_is_an_mps_and_a_time_slicing_config_each_named_as_gfd_labels_it():
    strategies = {name: sharing(c)[0] for name, c in plugin_configs().items()}
    assert strategies == {"mps": "mps", "time-slicing": "time-slicing"}


def test_each_config_shares_whole_gpus_under_the_renamed_resource_at_least_two_ways():
    for name, plugin_config in plugin_configs().items():
        _, replicated = sharing(plugin_config)
        assert [r["name"] for r in replicated["resources"]] == [WHOLE_GPU], name
        assert replicated["renameByDefault"] is True, name
        assert replicated["failRequestsGreaterThanOne"] is True, name
        assert advertised(replicated) == {SHARED_GPU: replicas_per_gpu()}, name
    assert replicas_per_gpu() >= 2, "one replica is no sharing (the plugin ignores it)"


def test_every_server_requests_one_shared_gpu_and_nothing_asks_for_a_whole_one():
    for deployment in deployments():
        resources = server(deployment)["resources"]
        assert resources["limits"][SHARED_GPU] == 1
        assert SHARED_GPU not in resources.get("requests", {}), "limits only, as in production"
    workloads = [*of_kind(render(OVERLAY), "Deployment"), *of_kind(render(OVERLAY), "CronJob")]
    for workload in workloads:
        for container in pod_spec(workload)["containers"]:
            for part in ("requests", "limits"):
                assert WHOLE_GPU not in container["resources"].get(part, {}), workload["metadata"]
    (quota,) = of_kind(render(OVERLAY), "ResourceQuota")
    assert quota["spec"]["hard"][f"requests.{WHOLE_GPU}"] == "0"


def test_the_pods_state_replicas_per_gpu_and_land_only_where_gpus_are_split_so():
    strategies = sorted(sharing(c)[0] for c in plugin_configs().values())
    for deployment in deployments():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["rlserve.io/replicas-per-gpu"] == str(replicas_per_gpu())
        terms = node_terms(deployment)
        replicas = terms["nvidia.com/gpu.replicas"]
        assert (replicas["operator"], replicas["values"]) == ("In", [str(replicas_per_gpu())])
        strategy = terms["nvidia.com/gpu.sharing-strategy"]
        assert (strategy["operator"], sorted(strategy["values"])) == ("In", strategies)


def test_the_gpu_placement_of_production_is_kept():
    production = named(render("production"), "Deployment", "rlserve-blue")
    for deployment in deployments():
        product = node_terms(deployment)["nvidia.com/gpu.product"]
        assert product == node_terms(production)["nvidia.com/gpu.product"]
        assert pod_spec(deployment)["tolerations"] == pod_spec(production)["tolerations"]


def settings_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> server_config.Settings:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config(render(OVERLAY))))
    for name, value in {**env(deployments()[0]), "RLSERVE_CONFIG_FILE": str(config_file)}.items():
        monkeypatch.setenv(name, value)
    return server_config.load()


def test_the_arena_limit_reaches_the_cuda_provider(tmp_path, monkeypatch):
    limit = config(render(OVERLAY))["gpu_memory_limit_bytes"]
    assert isinstance(limit, int)
    assert limit > 0
    settings = settings_of(tmp_path, monkeypatch)
    assert settings.gpu_memory_limit_bytes == limit
    cuda = runtime.provider_options(settings)["CUDAExecutionProvider"]
    assert cuda == {"gpu_mem_limit": str(limit), "arena_extend_strategy": "kSameAsRequested"}


def test_a_pods_gpu_memory_fits_its_share_of_the_smallest_gpu_it_may_land_on(tmp_path, monkeypatch):
    settings = settings_of(tmp_path, monkeypatch)
    assert settings.gpu_memory_limit_bytes is not None
    workers = int(env(deployments()[0])["RLSERVE_WORKERS"])
    # One model per pod (RLSERVE_DEFAULT_MODEL), each version a session in every worker.
    sessions = settings.resident_versions
    per_pod_mib = workers * (CUDA_CONTEXT_MIB + sessions * settings.gpu_memory_limit_bytes / MIB)
    for deployment in deployments():
        memory = node_terms(deployment)["nvidia.com/gpu.memory"]
        assert memory["operator"] == "Gt"
        (smallest_mib,) = memory["values"]
        share_mib = int(smallest_mib) / replicas_per_gpu()
        assert per_pod_mib <= share_mib, f"{per_pod_mib} MiB > {share_mib} MiB per replica"


def test_the_host_memory_limit_is_set_between_the_request_and_productions_limit():
    production = server(named(render("production"), "Deployment", "rlserve-blue"))["resources"]
    for deployment in deployments():
        resources = server(deployment)["resources"]
        limit = memory_bytes(resources["limits"]["memory"])
        request = memory_bytes(resources["requests"]["memory"])
        assert request <= limit <= memory_bytes(production["limits"]["memory"])


def memory_bytes(quantity: str) -> int:
    """A binary-suffixed memory quantity (Mi, Gi) in bytes."""
    units = {"Mi": MIB, "Gi": 1 << 30}
    return int(quantity[:-2]) * units[quantity[-2:]]


def test_only_the_arena_limit_differs_from_the_production_config():
    shared = dict(config(render(OVERLAY)))
    shared.pop("gpu_memory_limit_bytes")
    assert shared == config(render("production"))
