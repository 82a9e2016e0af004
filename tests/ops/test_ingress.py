"""The Ingresses in front of the production Service: backends, timeouts, body size, and the
blue-green switch going through them (k8s/overlays/production/ingress.yaml)."""

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

from ops.bluegreen.names import Names
from serve import config as server_config
from tests.ops.conftest import OVERLAYS, REPO, FakeKubectl, render, run_rollout
from tests.ops.ops_cluster import cluster
from tests.ops.ops_manifests import Doc, config, env, matches, named, of_kind, pod_labels, server

NGINX = "nginx.ingress.kubernetes.io/"
WITH_INGRESS = [o for o in OVERLAYS if of_kind(render(o), "Ingress")]
with_ingress = pytest.mark.parametrize("overlay", WITH_INGRESS)


def test_production_and_the_overlays_built_on_it_have_the_ingresses():
    assert {"production", "gpu-shared"} <= set(WITH_INGRESS)


def ingresses(overlay: str) -> dict[str, Doc]:
    """The Ingresses by what they carry: "http" or "grpc" (their backend protocol)."""
    by_protocol: dict[str, Doc] = {}
    for ingress in of_kind(render(overlay), "Ingress"):
        protocol = ingress["metadata"]["annotations"].get(NGINX + "backend-protocol", "HTTP")
        assert protocol.lower() not in by_protocol, f"two {protocol} Ingresses"
        by_protocol[protocol.lower()] = ingress
    assert set(by_protocol) == {"http", "grpc"}
    return by_protocol


def backends(ingress: Doc) -> list[dict[str, Any]]:
    return [
        path["backend"]["service"]
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
    ]


def settings_of(overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """What the blue server loads: its env and the rendered config.yaml (defaults included)."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config(render(overlay))))
    blue = named(render(overlay), "Deployment", "rlserve-blue")
    for name, value in {**env(blue), "RLSERVE_CONFIG_FILE": str(config_file)}.items():
        monkeypatch.setenv(name, value)
    return server_config.load()


def nginx_bytes(size: str) -> int:
    """An nginx size (client_max_body_size): bytes, or k/m/g (powers of 1024)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if size[-1:].lower() in units:
        return int(size[:-1]) * units[size[-1].lower()]
    return int(size)


@with_ingress
def test_every_backend_is_a_port_of_the_live_service_that_reaches_the_server(overlay):
    docs = render(overlay)
    live = Names().service  # the Service `rlserve rollout promote` and `rollback` switch
    blue = named(docs, "Deployment", "rlserve-blue")
    container_ports = {p["name"] for p in server(blue)["ports"]}
    for protocol, ingress in ingresses(overlay).items():
        assert ingress["spec"]["ingressClassName"] == "nginx"
        for backend in backends(ingress):
            assert backend["name"] == live, "the live Service, never a color or the preview"
            service = named(docs, "Service", backend["name"])
            assert "number" not in backend["port"], "by name: the Service's ports may renumber"
            (port,) = [p for p in service["spec"]["ports"] if p["name"] == backend["port"]["name"]]
            assert port["name"] == protocol
            assert port["targetPort"] in container_ports
            assert matches(service["spec"]["selector"], pod_labels(blue))


@with_ingress
def test_http_is_served_on_slash_and_grpc_on_its_own_host_both_over_tls(overlay):
    http, grpc = (ingresses(overlay)[p] for p in ("http", "grpc"))
    assert [p["path"] for r in http["spec"]["rules"] for p in r["http"]["paths"]] == ["/"]
    assert grpc["metadata"]["annotations"][NGINX + "backend-protocol"] == "GRPC", "h2c upstream"
    http_hosts = {r["host"] for r in http["spec"]["rules"]}
    grpc_hosts = {r["host"] for r in grpc["spec"]["rules"]}
    assert http_hosts == {"policies.example.com"}
    assert grpc_hosts == {"grpc.policies.example.com"}
    for ingress, hosts in ((http, http_hosts), (grpc, grpc_hosts)):
        (tls,) = ingress["spec"]["tls"]
        assert set(tls["hosts"]) == hosts, "gRPC through nginx needs HTTP/2, so TLS"
        assert tls["secretName"]


@with_ingress
def test_proxy_timeouts_outlast_every_request_deadline(overlay, tmp_path, monkeypatch):
    settings = settings_of(overlay, tmp_path, monkeypatch)
    longest_s = max(settings.default_deadline_ms, settings.generation_deadline_ms) / 1000
    assert longest_s >= 60, "the language-model deadline is the long one"
    for ingress in ingresses(overlay).values():
        notes = ingress["metadata"]["annotations"]
        for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
            assert int(notes[NGINX + timeout]) > longest_s, (overlay, timeout)


@with_ingress
def test_the_http_body_limit_is_max_body_bytes(overlay, tmp_path, monkeypatch):
    settings = settings_of(overlay, tmp_path, monkeypatch)
    http = ingresses(overlay)["http"]["metadata"]["annotations"]
    assert nginx_bytes(http[NGINX + "proxy-body-size"]) == settings.max_body_bytes


@with_ingress
def test_grpc_leaves_the_per_message_limit_to_the_server(overlay, tmp_path, monkeypatch):
    """nginx counts a stream's whole body; the server's gRPC limit is per message."""
    grpc = ingresses(overlay)["grpc"]["metadata"]["annotations"]
    assert grpc[NGINX + "proxy-body-size"] == "0"
    settings = settings_of(overlay, tmp_path, monkeypatch)
    show_options = (
        "import json; from serve.process.app import create_app; "
        "print(json.dumps(create_app().transports.grpc.options))"
    )
    done = subprocess.run(
        [sys.executable, "-c", show_options],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    options = dict(json.loads(done.stdout))
    assert options["grpc.max_receive_message_length"] == settings.max_body_bytes


@with_ingress
def test_the_network_policy_admits_the_ingress_controller_on_the_backend_ports(overlay):
    docs = render(overlay)
    policy = named(docs, "NetworkPolicy", "rlserve-server")["spec"]
    controller = {"kubernetes.io/metadata.name": "ingress-nginx"}
    service = named(docs, "Service", Names().service)
    target = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    wanted = {target[b["port"]["name"]] for i in ingresses(overlay).values() for b in backends(i)}
    admitted = {
        p["port"]
        for rule in policy["ingress"]
        if any(
            s.get("namespaceSelector", {}).get("matchLabels") == controller for s in rule["from"]
        )
        for p in rule["ports"]
    }
    assert wanted == {"http", "grpc"}
    assert wanted <= admitted


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as `kubectl patch --type=merge` applies it."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def pinned(ingress: Doc, service: Doc) -> Any:
    """What of the Service the Ingress depends on: its name, namespace and named ports."""
    used = {b["port"]["name"] for b in backends(ingress)}
    return (
        service["metadata"]["name"],
        service["metadata"].get("namespace"),
        [p for p in service["spec"]["ports"] if p["name"] in used],
    )


@pytest.mark.parametrize("step", ["promote", "rollback"])
def test_the_blue_green_switch_changes_only_what_the_ingresses_do_not_pin(
    step: str, kubectl: FakeKubectl
):
    docs = render("production")
    kubectl.use(cluster())
    assert run_rollout(step) == 0
    live = f"patch service {Names().service} "
    (switch,) = [c for c in kubectl.calls() if live in " ".join(c)]
    assert "--type=merge" in switch
    body = json.loads(switch[switch.index("-p") + 1])
    before = named(docs, "Service", Names().service)
    after = merge_patch(copy.deepcopy(before), body)
    for ingress in ingresses("production").values():
        assert pinned(ingress, after) == pinned(ingress, before)
    # ... and the same Ingresses now reach the other color.
    green = pod_labels(named(docs, "Deployment", "rlserve-green"))
    blue = pod_labels(named(docs, "Deployment", "rlserve-blue"))
    assert matches(after["spec"]["selector"], green)
    assert not matches(after["spec"]["selector"], blue)


def test_no_ingress_reaches_the_preview_service_that_deploy_repoints():
    for overlay in WITH_INGRESS:
        for ingress in ingresses(overlay).values():
            assert Names().preview not in {b["name"] for b in backends(ingress)}
