"""k8s/rl, the decoupled RL layout: it renders, validates, and its parts agree with each
other (the loop's config in the ConfigMap, the KafkaTopics, Services, NetworkPolicies)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
import yaml

from loop import config as loop_config
from loop.commands import CollectArgs, resolve
from tests.ops.conftest import K8S, render_path
from tests.ops.ops_manifests import Doc, matches, named, of_kind, pod_labels, pod_spec, port_named

RL = K8S / "rl"
# Custom resources whose schemas kubernetes-validate does not ship: the Prometheus Operator's
# PodMonitor and Strimzi's KafkaTopic. Both are checked by the tests below instead (the
# topics: apiVersion, cluster label, namespace, name, partitions, replication).
CUSTOM_RESOURCES = {"PodMonitor", "KafkaTopic"}
COLORS = ("blue", "green")
WORKER, TRAINER = "rlserve-rollout-worker", "rlserve-trainer"
CONFIG_MAP = "rlserve-loop-config"
KEY = "loop.yaml"


def docs() -> tuple[Doc, ...]:
    return render_path(RL)


def servers() -> list[Doc]:
    return [named(docs(), "Deployment", f"rlserve-{c}") for c in COLORS]


def worker() -> Doc:
    return named(docs(), "Deployment", WORKER)


def trainer() -> Doc:
    return named(docs(), "Job", TRAINER)


def container(workload: Doc) -> Doc:
    (only,) = pod_spec(workload)["containers"]
    return only


def loop_config_map() -> Doc:
    (found,) = [d for d in of_kind(docs(), "ConfigMap") if KEY in d["data"]]
    return found


@pytest.fixture
def loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> loop_config.LoopConfig:
    """The ConfigMap's loop.yaml as the workers and the trainer load it."""
    for name in list(os.environ):
        if name.startswith(loop_config.ENV_PREFIX) or name == loop_config.SERVER_TOKEN_ENV:
            monkeypatch.delenv(name)
    path = tmp_path / KEY
    path.write_text(loop_config_map()["data"][KEY])
    return loop_config.load(path)


def kafka_topics() -> dict[str, Doc]:
    return {d["spec"]["topicName"]: d for d in of_kind(docs(), "KafkaTopic")}


def service_port(service: Doc, port: int) -> Doc:
    (found,) = [p for p in service["spec"]["ports"] if p["port"] == port]
    return found


def egress_to(policy: Doc, labels: dict[str, str], namespace: str | None) -> set[int | str]:
    """The ports ``policy`` lets its pods reach on pods with ``labels`` in ``namespace``
    (None: the policy's own namespace)."""
    ports: set[int | str] = set()
    for rule in policy["spec"].get("egress", []):
        for peer in rule.get("to", []):
            names = peer.get("namespaceSelector", {}).get("matchLabels")
            in_namespace = (
                names is None
                if namespace is None
                else names == {"kubernetes.io/metadata.name": namespace}
            )
            if in_namespace and matches(peer.get("podSelector", {}).get("matchLabels", {}), labels):
                ports |= {p["port"] for p in rule["ports"]}
    return ports


def policies_for(labels: dict[str, str]) -> list[Doc]:
    return [
        p
        for p in of_kind(docs(), "NetworkPolicy")
        if matches(p["spec"]["podSelector"].get("matchLabels", {}), labels)
    ]


# -- it renders and validates ---------------------------------------------------------------


def test_the_rl_layout_builds_with_kubectl_kustomize():
    kinds = {d["kind"] for d in docs()}
    assert {"Deployment", "Job", "KafkaTopic", "ConfigMap", "NetworkPolicy"} <= kinds
    assert {d["metadata"]["name"] for d in of_kind(docs(), "Deployment")} == {
        "rlserve-blue",
        "rlserve-green",
        WORKER,
    }


@pytest.mark.parametrize("version", ["1.29", "1.33"])
def test_the_rl_layout_validates_strictly_against_the_kubernetes_schemas(version):
    problems = []
    for doc in docs():
        if doc["kind"] in CUSTOM_RESOURCES:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            problems.append(f"{doc['kind']}/{doc['metadata']['name']} {where}: {exc.message}")
    assert problems == []


def test_only_podmonitor_and_kafkatopic_skip_schema_validation():
    for doc in docs():
        if doc["kind"] not in CUSTOM_RESOURCES:
            kubernetes_validate.validate(doc, "1.33", strict=True)  # raises if no schema
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(of_kind(docs(), "KafkaTopic")[0], "1.33", strict=True)


def test_namespaced_objects_live_in_rlserve_rl_and_the_topics_with_their_kafka():
    for doc in docs():
        if doc["kind"] in ("Namespace", "PersistentVolume"):
            continue
        expected = "kafka" if doc["kind"] == "KafkaTopic" else "rlserve-rl"
        assert doc["metadata"].get("namespace") == expected, doc["metadata"]["name"]
    assert [d["metadata"]["name"] for d in of_kind(docs(), "Namespace")] == ["rlserve-rl"]


# -- the Kafka topics and the loop's config agree -------------------------------------------


def test_the_kafka_topics_are_strimzi_topics_of_one_cluster():
    topics = of_kind(docs(), "KafkaTopic")
    assert len(topics) == 2
    for topic in topics:
        assert topic["apiVersion"] == "kafka.strimzi.io/v1beta2"
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "rl-kafka"
        assert "_" not in topic["metadata"]["name"], "Kubernetes names take no underscores"
        spec = topic["spec"]
        insync = int(spec["config"]["min.insync.replicas"])
        assert spec["replicas"] > insync >= 2, "acks=all survives one broker down"


def test_the_workers_buffer_url_names_the_kafka_topic_its_partitions_and_brokers(loaded):
    (topic,) = [
        t for t in of_kind(docs(), "KafkaTopic") if t["spec"]["topicName"] == "rl_experience"
    ]
    cluster = topic["metadata"]["labels"]["strimzi.io/cluster"]
    namespace = topic["metadata"]["namespace"]
    for url in (loaded.producer_buffer_url(), loaded.consumer_buffer_url()):
        parts = urlsplit(url)
        assert parts.scheme == "kafka"
        assert parts.path.strip("/") == topic["spec"]["topicName"]
        assert int(parse_qs(parts.query)["partitions"][0]) == topic["spec"]["partitions"]
        # Strimzi's bootstrap Service for the cluster, in the topic's namespace.
        assert parts.hostname == f"{cluster}-kafka-bootstrap.{namespace}.svc"
    producer = parse_qs(urlsplit(loaded.producer_buffer_url()).query)
    assert producer["group"] == [loaded.consumer_group], "back-pressure on the trainer's lag"


def test_the_offline_stream_has_its_topic_too(loaded):
    assert loaded.sync_policy.fallback_strategy == "offline"
    offline = loaded.offline_buffer_url()
    assert offline is not None
    parts = urlsplit(offline)
    topics = kafka_topics()
    assert parts.path.strip("/") in topics
    assert parts.hostname == urlsplit(loaded.consumer_buffer_url()).hostname
    main, routed = topics["rl_experience"], topics[parts.path.strip("/")]
    assert routed["metadata"]["labels"] == main["metadata"]["labels"]
    assert int(parse_qs(parts.query)["partitions"][0]) == routed["spec"]["partitions"]


def test_the_config_map_holds_a_decoupled_config_in_the_reference_shape(loaded):
    raw = yaml.safe_load(loop_config_map()["data"][KEY])
    reference = {"cluster_mode", "inference_cluster", "training_cluster", "data_buffer"}
    assert reference | {"sync_policy"} <= set(raw)
    assert {"type", "topic", "partition"} <= set(raw["data_buffer"])
    assert "admin_token" not in raw, "the token comes from the Secret"
    assert loaded.cluster_mode == "decoupled"
    assert loaded.buffer_type == "kafka"
    assert loaded.sync_controller_kwargs()["max_staleness"] == 100


# -- workers and trainer read it ----------------------------------------------------------------


@pytest.mark.parametrize("workload", [worker, trainer])
def test_workers_and_trainer_read_the_loop_config_from_the_hashed_config_map(workload):
    spec = pod_spec(workload())
    name = loop_config_map()["metadata"]["name"]
    assert name.startswith(CONFIG_MAP + "-"), "content-hashed by configMapGenerator"
    (volume,) = [v for v in spec["volumes"] if v.get("configMap", {}).get("name") == name]
    (mount,) = [m for m in container(workload())["volumeMounts"] if m["name"] == volume["name"]]
    args = container(workload())["args"]
    assert args[args.index("--config") + 1] == f"{mount['mountPath']}/{KEY}"
    assert mount["readOnly"] is True


def test_the_worker_runs_rlserve_collect_and_the_trainer_the_example_in_one_image():
    assert container(worker())["command"] == ["rlserve", "collect"]
    trainer_command = container(trainer())["command"] + container(trainer())["args"][:1]
    assert trainer_command == ["python", "examples/ppo_trainer.py", "--config"]
    assert container(trainer())["workingDir"] == "/app"
    assert container(worker())["image"] == container(trainer())["image"]
    assert container(worker())["image"] != container(servers()[0])["image"]


def test_rlserve_collect_resolves_the_config_map_into_its_settings(loaded, tmp_path):
    path = tmp_path / KEY
    given = resolve(CollectArgs(config=[str(path)]))
    assert given.server == loaded.server_url() == "http://rlserve:80"
    assert given.buffer == loaded.producer_buffer_url()
    assert (given.env, given.num_envs) == ("CartPole-v1", 64)
    assert given.model == "cartpole"
    assert given.buffer_options is not None
    assert given.buffer_options.max_pending == loaded.data_buffer.max_pending


def test_the_server_url_is_the_production_service_and_policies_let_the_loop_reach_it(loaded):
    host, port = loop_config.host_port(loaded.inference_cluster.endpoint)
    service = named(docs(), "Service", host)
    target = service_port(service, port)["targetPort"]
    server_labels = pod_labels(servers()[0])
    assert matches(service["spec"]["selector"], server_labels)
    for server in servers():
        pod_port = port_named(container(server), target)
        assert pod_port == 8000
    for workload in (worker(), trainer()):
        labels = pod_labels(workload)
        reachable = set().union(*(egress_to(p, server_labels, None) for p in policies_for(labels)))
        assert 8000 in reachable, workload["metadata"]["name"]
        ingress = [
            rule
            for p in policies_for(server_labels)
            for rule in p["spec"].get("ingress", [])
            if any(
                matches(s.get("podSelector", {}).get("matchLabels", {}), labels)
                for s in rule["from"]
                if "namespaceSelector" not in s
            )
        ]
        assert any({"port": target, "protocol": "TCP"} in r["ports"] for r in ingress)


def test_workers_and_trainer_may_reach_the_kafka_brokers_and_dns(loaded):
    (topic,) = [
        t for t in of_kind(docs(), "KafkaTopic") if t["spec"]["topicName"] == "rl_experience"
    ]
    brokers = {"strimzi.io/cluster": topic["metadata"]["labels"]["strimzi.io/cluster"]}
    _, broker_port = loop_config.host_port(loaded.data_buffer.brokers.split(",")[0])
    for workload in (worker(), trainer()):
        policies = policies_for(pod_labels(workload))
        kafka = set().union(
            *(egress_to(p, brokers, topic["metadata"]["namespace"]) for p in policies)
        )
        assert broker_port in kafka
        dns = set().union(*(egress_to(p, {"k8s-app": "kube-dns"}, "kube-system") for p in policies))
        assert 53 in dns


def test_the_trainer_metrics_endpoint_is_its_service_scraped_by_prometheus(loaded):
    host, port = loop_config.host_port(loaded.training_cluster.endpoint)
    service = named(docs(), "Service", host)
    assert matches(service["spec"]["selector"], pod_labels(trainer()))
    target = service_port(service, port)["targetPort"]
    assert port_named(container(trainer()), target) == loaded.trainer_metrics_address()[1]
    monitor = named(docs(), "PodMonitor", TRAINER)["spec"]
    assert matches(monitor["selector"]["matchLabels"], pod_labels(trainer()))
    assert [e["port"] for e in monitor["podMetricsEndpoints"]] == [target]
    (policy,) = [p for p in policies_for(pod_labels(trainer())) if p["spec"].get("ingress")]
    (rule,) = policy["spec"]["ingress"]
    assert {"port": target, "protocol": "TCP"} in rule["ports"]


def test_the_workers_serve_metrics_on_their_metrics_port_scraped_by_prometheus():
    args = container(worker())["args"]
    port = int(args[args.index("--metrics-port") + 1])
    assert port_named(container(worker()), "metrics") == port
    monitor = named(docs(), "PodMonitor", WORKER)["spec"]
    assert matches(monitor["selector"]["matchLabels"], pod_labels(worker()))
    assert [e["port"] for e in monitor["podMetricsEndpoints"]] == ["metrics"]
    (policy,) = [p for p in policies_for(pod_labels(worker())) if p["spec"].get("ingress")]
    (rule,) = policy["spec"]["ingress"]
    assert {"port": "metrics", "protocol": "TCP"} in rule["ports"]


# -- servers: pushes land in a writable repository --------------------------------------------


def secret_env(workload: Doc, name: str) -> dict[str, Any]:
    (found,) = [e for e in container(workload)["env"] if e["name"] == name]
    return found["valueFrom"]["secretKeyRef"]


def test_servers_take_pushes_from_the_trainer_with_one_secret():
    token = secret_env(trainer(), loop_config.SERVER_TOKEN_ENV)
    for server in servers():
        assert secret_env(server, "RLSERVE_ADMIN_TOKEN") == token


def test_the_servers_write_the_shared_repository_on_a_read_write_many_volume():
    (volume,) = of_kind(docs(), "PersistentVolume")
    claim = named(docs(), "PersistentVolumeClaim", "rlserve-models")
    assert volume["spec"]["accessModes"] == ["ReadWriteMany"] == claim["spec"]["accessModes"]
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"] == "rlserve-rl-models"
    assert volume["spec"]["claimRef"] == {"namespace": "rlserve-rl", "name": "rlserve-models"}
    assert "ro" not in volume["spec"].get("mountOptions", [])
    assert not volume["spec"]["nfs"].get("readOnly", False)
    for server in servers():
        volumes = {v["name"]: v for v in pod_spec(server)["volumes"]}
        assert volumes["models"]["persistentVolumeClaim"] == {
            "claimName": "rlserve-models",
            "readOnly": False,
        }
        mounts = {m["name"]: m for m in container(server)["volumeMounts"]}
        assert mounts["models"]["readOnly"] is False


# -- pods -----------------------------------------------------------------------------------


def workloads() -> list[Doc]:
    return [*of_kind(docs(), "Deployment"), *of_kind(docs(), "Job"), *of_kind(docs(), "CronJob")]


def test_every_pod_runs_restricted_and_requests_resources():
    for workload in workloads():
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        if workload["kind"] != "CronJob":  # the off-peak kubectl needs its account
            assert spec["automountServiceAccountToken"] is False
        tmp = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for one in spec["containers"]:
            context = one["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(one["resources"]["requests"])
            mounts = {m["mountPath"]: m["name"] for m in one["volumeMounts"]}
            assert mounts.get("/tmp") in tmp, "a writable /tmp under a read-only root"


def test_the_trainer_checkpoint_survives_a_new_pod_where_the_config_puts_it(loaded):
    mounts = {m["name"]: m["mountPath"] for m in container(trainer())["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(trainer())["volumes"]}
    claim = volumes["state"]["persistentVolumeClaim"]["claimName"]
    named(docs(), "PersistentVolumeClaim", claim)
    assert Path(loaded.trainer["checkpoint"]).parent == Path(mounts["state"])
    assert pod_spec(trainer())["restartPolicy"] == "OnFailure"


def test_loop_pods_are_not_selected_by_the_servers_selectors():
    server_selectors = [d["spec"]["selector"]["matchLabels"] for d in servers()]
    server_selectors += [
        d["spec"]["selector"]["matchLabels"] for d in of_kind(docs(), "PodDisruptionBudget")
    ]
    server_selectors.append(
        named(docs(), "PodMonitor", "rlserve")["spec"]["selector"]["matchLabels"]
    )
    for server in servers():
        server_selectors += [
            s["labelSelector"]["matchLabels"] for s in pod_spec(server)["topologySpreadConstraints"]
        ]
    for workload in (worker(), trainer()):
        labels = pod_labels(workload)
        assert not any(matches(s, labels) for s in server_selectors), workload["metadata"]["name"]
    assert matches(worker()["spec"]["selector"]["matchLabels"], pod_labels(worker()))


def test_the_gpu_quota_fits_both_colors_at_full_size_and_the_trainer():
    (quota,) = of_kind(docs(), "ResourceQuota")
    allowed = int(quota["spec"]["hard"]["requests.nvidia.com/gpu"])
    needed = int(container(trainer())["resources"]["limits"]["nvidia.com/gpu"])
    for color, server in zip(COLORS, servers(), strict=True):
        hpa = named(docs(), "HorizontalPodAutoscaler", f"rlserve-{color}")
        needed += hpa["spec"]["maxReplicas"] * int(
            container(server)["resources"]["limits"]["nvidia.com/gpu"]
        )
    assert needed <= allowed
    assert "nvidia.com/gpu" not in container(worker())["resources"].get("limits", {})
