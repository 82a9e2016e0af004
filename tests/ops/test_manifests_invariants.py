"""What the rendered manifests must get right, checked over every overlay."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from serve import config as server_config
from tests.ops.conftest import K8S, OVERLAYS, REPO, render
from tests.ops.ops_manifests import (
    config,
    env,
    matches,
    named,
    of_kind,
    pod_labels,
    pod_spec,
    port_named,
    server,
)

COLORS = ("blue", "green")
# Routes the server answers (serve/process/operations.py): HTTP probes may only use these.
PROBE_ROUTES = {"/health", "/ready"}
# The Open Inference Protocol over gRPC: Triton's port, the container port's name.
GRPC_PORT, GRPC = 8001, "grpc"
# Per color, only these may differ: the color itself, the image, the model version.
VERSION_FIELDS = ("rlserve.io/model-version", "RLSERVE_VERSION_POLICY")

overlays = pytest.mark.parametrize("overlay", OVERLAYS)


def deployments(overlay: str) -> dict[str, dict[str, Any]]:
    return {c: named(render(overlay), "Deployment", f"rlserve-{c}") for c in COLORS}


def masked(deployment: dict[str, Any], color: str) -> str:
    """The Deployment with its color, image and model version blanked out."""
    doc = copy.deepcopy(deployment)
    for notes in (
        doc["metadata"]["annotations"],
        doc["spec"]["template"]["metadata"]["annotations"],
    ):
        notes.pop(VERSION_FIELDS[0])
    container = server(doc)
    container.pop("image")
    container["env"] = [e for e in container["env"] if e["name"] != VERSION_FIELDS[1]]
    return json.dumps(doc, sort_keys=True).replace(color, "COLOR")


@overlays
def test_blue_and_green_differ_only_in_color_image_and_model_version(overlay):
    blue, green = deployments(overlay).values()
    assert masked(blue, "blue") == masked(green, "green")


@overlays
def test_no_deployment_sets_replicas_because_the_hpa_owns_them(overlay):
    assert all("replicas" not in d["spec"] for d in deployments(overlay).values())


@overlays
def test_selectors_match_the_labels_of_their_pods(overlay):
    docs = render(overlay)
    pods = {c: pod_labels(d) for c, d in deployments(overlay).items()}
    for color, deployment in deployments(overlay).items():
        assert matches(deployment["spec"]["selector"]["matchLabels"], pods[color])
        for spread in pod_spec(deployment)["topologySpreadConstraints"]:
            assert matches(spread["labelSelector"]["matchLabels"], pods[color])
        pdb = named(docs, "PodDisruptionBudget", f"rlserve-{color}")
        assert [c for c in COLORS if matches(pdb["spec"]["selector"]["matchLabels"], pods[c])] == [
            color
        ]
    production, preview = (named(docs, "Service", n) for n in ("rlserve", "rlserve-preview"))
    assert [c for c in COLORS if matches(production["spec"]["selector"], pods[c])] == ["blue"]
    assert [c for c in COLORS if matches(preview["spec"]["selector"], pods[c])] == ["green"]
    assert set(production["spec"]["selector"]) == {"app", "color"}
    monitor = named(docs, "PodMonitor", "rlserve")["spec"]["selector"]["matchLabels"]
    policy = named(docs, "NetworkPolicy", "rlserve-server")["spec"]["podSelector"]["matchLabels"]
    assert all(matches(monitor, p) and matches(policy, p) for p in pods.values())


@overlays
def test_the_production_service_records_its_active_color(overlay):
    service = named(render(overlay), "Service", "rlserve")
    color = service["spec"]["selector"]["color"]
    assert service["metadata"]["annotations"]["rlserve.io/active-color"] == color


@overlays
def test_probes_hit_routes_the_server_answers_on_the_port_it_binds(overlay):
    for deployment in deployments(overlay).values():
        container, variables = server(deployment), env(deployment)
        assert variables["RLSERVE_HOST"] == "0.0.0.0"
        assert port_named(container, "http") == int(variables["RLSERVE_PORT"])
        # Readiness and liveness keep their HTTP meaning (the drain timing, a stuck batch).
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["path"] in PROBE_ROUTES
            assert container[probe]["httpGet"]["port"] == "http"
        # Startup asks the gRPC health service, which answers like /ready.
        startup = container["startupProbe"]
        assert "httpGet" not in startup
        assert startup["grpc"]["port"] == port_named(container, GRPC)
        assert startup["grpc"].get("service", "") == ""
    for service in of_kind(render(overlay), "Service"):
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http", GRPC]
    (endpoint,) = named(render(overlay), "PodMonitor", "rlserve")["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")


@overlays
def test_the_grpc_port_is_the_same_in_the_env_container_services_policy_and_probe(overlay):
    docs = render(overlay)
    for deployment in deployments(overlay).values():
        container, variables = server(deployment), env(deployment)
        assert int(variables["RLSERVE_GRPC_PORT"]) == port_named(container, GRPC) == GRPC_PORT
        (declared,) = [p for p in container["ports"] if p["name"] == GRPC]
        assert declared["protocol"] == "TCP"
        assert container["startupProbe"]["grpc"]["port"] == GRPC_PORT
    for service in of_kind(docs, "Service"):
        by_name = {p["name"]: p for p in service["spec"]["ports"]}
        assert by_name[GRPC]["port"] == GRPC_PORT, "Triton's port, also on the Service"
        assert by_name[GRPC]["targetPort"] == GRPC
        assert by_name[GRPC]["appProtocol"] == "kubernetes.io/h2c"
    policy = named(docs, "NetworkPolicy", "rlserve-server")["spec"]
    for rule in policy["ingress"]:
        ports = {p["port"] for p in rule["ports"]}
        assert "http" not in ports or GRPC in ports, "gRPC from every source allowed HTTP"


@overlays
def test_the_server_listens_for_grpc_where_the_probe_and_services_point(overlay, tmp_path):
    variables = server_environment(overlay, tmp_path)
    show_address = (
        "from serve.process.app import create_app; print(create_app().transports.grpc.address)"
    )
    done = subprocess.run(
        [sys.executable, "-c", show_address],
        env={**os.environ, **variables},
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert done.stdout.split() == [f"0.0.0.0:{GRPC_PORT}"]


def server_environment(overlay: str, tmp_path: Path) -> dict[str, str]:
    """The blue container's RLSERVE_* env, its config file written where it points."""
    variables = env(deployments(overlay)["blue"])
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config(render(overlay))))
    return {**variables, "RLSERVE_CONFIG_FILE": str(config_file)}


@overlays
def test_the_config_map_and_the_env_load_into_the_servers_settings(overlay, tmp_path, monkeypatch):
    variables = server_environment(overlay, tmp_path)
    fields = set(server_config.Settings.model_fields)
    # `workers` is read by serve/process/gunicorn_conf.py; the serving branch adds it to Settings.
    unknown = {n for n in variables if n.removeprefix("RLSERVE_").lower() not in fields}
    assert unknown <= {"RLSERVE_WORKERS"}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = server_config.load()
    assert settings.port == 8000
    assert settings.grpc_port == GRPC_PORT
    assert settings.host == "0.0.0.0"
    assert settings.version_policy.specific is not None


@overlays
def test_gunicorn_binds_the_port_the_probes_use(overlay, tmp_path):
    conf = REPO / "serve" / "process" / "gunicorn_conf.py"
    if not conf.exists():
        pytest.skip("serve/process/gunicorn_conf.py arrives with the serving branch")
    variables = server_environment(overlay, tmp_path)
    variables["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "metrics")
    show_bind = "import runpy, sys; print(runpy.run_path(sys.argv[1])['bind'])"
    done = subprocess.run(
        [sys.executable, "-c", show_bind, str(conf)],
        env={**os.environ, **variables},
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    port = port_named(server(deployments(overlay)["blue"]), "http")
    assert done.stdout.split() == [f"0.0.0.0:{port}"]


@overlays
def test_the_grace_period_outlasts_prestop_drain_in_flight_work_and_a_deadline(overlay):
    settings = config(render(overlay))
    drain, graceful = settings["drain_delay_s"], settings["graceful_timeout_s"]
    deadline = settings["default_deadline_ms"] / 1000
    for deployment in deployments(overlay).values():
        pre_stop = server(deployment)["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        grace = pod_spec(deployment)["terminationGracePeriodSeconds"]
        assert grace > int(pre_stop[1]) + drain + graceful + deadline
        # gunicorn's own graceful_timeout (serve/process/gunicorn_conf.py) must end first.
        assert grace > int(pre_stop[1]) + drain + graceful + 5


@overlays
def test_probe_budgets_follow_from_the_config(overlay):
    settings = config(render(overlay))
    for deployment in deployments(overlay).values():
        container = server(deployment)
        ready, live, start = (
            container[p] for p in ("readinessProbe", "livenessProbe", "startupProbe")
        )
        noticed = ready["periodSeconds"] * ready["failureThreshold"] + ready["timeoutSeconds"]
        assert noticed <= settings["drain_delay_s"], "the kubelet sees the drain's 503 in time"
        live_window = live["periodSeconds"] * live["failureThreshold"]
        assert live_window > settings["default_deadline_ms"] / 1000
        assert start["periodSeconds"] * start["failureThreshold"] >= 300, "covers a slow start"


def gpu_in(resources: dict[str, Any]) -> set[str]:
    return {part for part, values in resources.items() if "nvidia.com/gpu" in (values or {})}


def test_production_asks_for_a_gpu_in_limits_only_on_gpu_nodes():
    for deployment in deployments("production").values():
        assert gpu_in(server(deployment)["resources"]) == {"limits"}
        spec = pod_spec(deployment)
        (term,) = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert [e["key"] for e in term["matchExpressions"]] == ["nvidia.com/gpu.product"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
            "tolerations"
        ]


def test_cpu_dev_asks_for_no_gpu():
    for deployment in deployments("cpu-dev").values():
        assert gpu_in(server(deployment)["resources"]) == set()
        assert "tolerations" not in pod_spec(deployment)


@overlays
def test_every_container_requests_resources(overlay):
    workloads = [*deployments(overlay).values(), *of_kind(render(overlay), "CronJob")]
    for workload in workloads:
        for container in pod_spec(workload)["containers"]:
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])


# Whole GPUs, and replicas of shared ones (k8s/overlays/gpu-shared).
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")


@overlays
def test_the_gpu_quota_fits_both_colors_at_full_size(overlay):
    docs = render(overlay)
    (quota,) = of_kind(docs, "ResourceQuota")
    hard = quota["spec"]["hard"]
    assert "requests.nvidia.com/gpu" in hard
    for resource in GPU_RESOURCES:
        per_pod = {
            c: int(server(d)["resources"]["limits"].get(resource, 0))
            for c, d in deployments(overlay).items()
        }
        needed = sum(
            named(docs, "HorizontalPodAutoscaler", f"rlserve-{c}")["spec"]["maxReplicas"]
            * per_pod[c]
            for c in COLORS
        )
        if needed:
            assert needed <= int(hard[f"requests.{resource}"]), f"{resource} is not quota'd"


@overlays
def test_every_pod_runs_restricted(overlay):
    workloads = [*deployments(overlay).values(), *of_kind(render(overlay), "CronJob")]
    for workload in workloads:
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        tmp = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts.get("/tmp") in tmp, "a writable /tmp under a read-only root"
    for deployment in deployments(overlay).values():
        assert pod_spec(deployment)["securityContext"]["runAsUser"] == 10001


@overlays
def test_each_color_has_its_own_hpa_on_cpu_and_the_queue_signal(overlay):
    docs = render(overlay)
    for color in COLORS:
        hpa = named(docs, "HorizontalPodAutoscaler", f"rlserve-{color}")
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": f"rlserve-{color}",
        }
        cpu, pods = hpa["spec"]["metrics"]
        assert cpu["resource"]["name"] == "cpu"
        assert cpu["resource"]["target"]["averageUtilization"] == 70
        assert pods["type"] == "Pods"
        assert pods["pods"]["target"]["type"] == "AverageValue"
        assert float(pods["pods"]["target"]["averageValue"]) < config(docs)["max_queue_rows"]
        behavior = hpa["spec"]["behavior"]
        assert {"scaleUp", "scaleDown"} <= set(behavior)
        assert all("stabilizationWindowSeconds" in b for b in behavior.values())


@overlays
def test_the_custom_metric_is_the_one_prometheus_adapter_serves(overlay):
    rules = yaml.safe_load((K8S / "prometheus-adapter" / "rules.yaml").read_text())["rules"]
    served = {r["name"]["as"] for r in rules}
    assert all(r["seriesQuery"].startswith(r["name"]["as"] + "{") for r in rules)
    for hpa in of_kind(render(overlay), "HorizontalPodAutoscaler"):
        (pods,) = [m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
        assert pods["pods"]["metric"]["name"] in served == {"rlserve_pending_rows"}


@overlays
def test_the_offpeak_cronjob_may_only_patch_the_two_hpas(overlay):
    docs = render(overlay)
    (role,) = of_kind(docs, "Role")
    hpas = sorted(h["metadata"]["name"] for h in of_kind(docs, "HorizontalPodAutoscaler"))
    (rule,) = role["rules"]
    assert rule["apiGroups"] == ["autoscaling"]
    assert rule["resources"] == ["horizontalpodautoscalers"]
    assert rule["verbs"] == ["patch"]
    assert sorted(rule["resourceNames"]) == hpas
    (binding,) = of_kind(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    for job in of_kind(docs, "CronJob"):
        spec = pod_spec(job)
        assert [s["name"] for s in binding["subjects"]] == [spec["serviceAccountName"]]
        (container,) = spec["containers"]
        assert container["args"][:2] == ["patch", "hpa"]
        assert sorted(container["args"][2:4]) == hpas
        assert "minReplicas" in container["args"][-1]
    assert all("automountServiceAccountToken" in pod_spec(d) for d in deployments(overlay).values())


@overlays
def test_the_namespace_denies_all_traffic_but_what_the_server_needs(overlay):
    docs = render(overlay)
    deny = named(docs, "NetworkPolicy", "default-deny-all")["spec"]
    assert deny["podSelector"] == {}
    assert sorted(deny["policyTypes"]) == ["Egress", "Ingress"]
    server_policy = named(docs, "NetworkPolicy", "rlserve-server")["spec"]
    (ingress,) = server_policy["ingress"]
    assert [p["port"] for p in ingress["ports"]] == ["http", GRPC]
    sources = [s.get("namespaceSelector", {}).get("matchLabels", {}) for s in ingress["from"]]
    assert {"kubernetes.io/metadata.name": "monitoring"} in sources
    assert server_policy["egress"] == []


@overlays
def test_config_changes_roll_the_pods(overlay):
    (config_map,) = [d for d in of_kind(render(overlay), "ConfigMap") if "config.yaml" in d["data"]]
    name = config_map["metadata"]["name"]
    assert name.startswith("rlserve-config-"), "content-hashed by configMapGenerator"
    for deployment in deployments(overlay).values():
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        assert volumes["config"]["configMap"]["name"] == name
