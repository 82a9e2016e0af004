"""`rlserve rollout` against a recording kubectl stand-in (no cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cli
from tests.ops.conftest import FakeKubectl, run_rollout
from tests.ops.ops_cluster import canary_status, cluster

MUTATING = {"patch", "scale", "apply", "delete", "annotate", "label", "set", "edit"}


def verb(call: list[str]) -> str:
    return call[1] if call[0].startswith("--namespace") else call[0]


def mutations(kubectl: FakeKubectl) -> list[list[str]]:
    return [c for c in kubectl.calls() if verb(c) in MUTATING]


def position(calls: list[list[str]], *parts: str) -> int:
    """Index of the first call whose joined argv contains every part."""
    joined = [" ".join(c) for c in calls]
    return next(i for i, line in enumerate(joined) if all(p in line for p in parts))


def patch_body(call: list[str]) -> dict:
    return json.loads(call[call.index("-p") + 1])


def service_patches(kubectl: FakeKubectl) -> list[list[str]]:
    return [c for c in mutations(kubectl) if "service" in c and "rlserve" in c]


def test_promote_prescales_verifies_keeps_the_old_color_warm_then_switches(kubectl):
    kubectl.use(cluster())
    assert run_rollout("promote") == 0
    calls = kubectl.calls()
    order = [
        position(calls, "patch hpa rlserve-green"),
        position(calls, "scale deployment/rlserve-green", "--replicas=3"),
        position(calls, "patch service rlserve-preview"),
        position(calls, "rollout status deployment/rlserve-green"),
        position(calls, "get --raw", "rlserve-preview:http/proxy/ready"),
        position(calls, "create --raw", "rlserve-preview:http/proxy/v1/models/cartpole"),
        position(calls, "patch hpa rlserve-blue"),
        position(calls, "patch service rlserve --type=merge"),
    ]
    assert order == sorted(order)
    assert order[-1] == len(calls) - 1, "the Service switch is the last command"


def test_promote_raises_the_idle_floor_to_the_active_size_and_remembers_the_old_one(kubectl):
    kubectl.use(cluster())
    assert run_rollout("promote") == 0
    calls = kubectl.calls()
    body = patch_body(calls[position(calls, "patch hpa rlserve-green")])
    assert body["spec"] == {"minReplicas": 3}
    assert body["metadata"]["annotations"]["rlserve.io/restore-min-replicas"] == "2"


def test_promote_merge_patches_only_the_color_of_the_selector(kubectl):
    kubectl.use(cluster())
    assert run_rollout("promote") == 0
    (switch,) = service_patches(kubectl)
    body = patch_body(switch)
    assert "--type=merge" in switch
    assert body["spec"] == {"selector": {"color": "green"}}, "app stays as it is"
    assert body["metadata"]["annotations"]["rlserve.io/active-color"] == "green"
    assert body["metadata"]["annotations"]["rlserve.io/previous-color"] == "blue"


def test_promote_refuses_a_color_whose_rollout_is_not_ready(kubectl, capsys):
    kubectl.use(cluster(idle_rollout_ok=False))
    assert run_rollout("promote") == 1
    assert service_patches(kubectl) == []
    assert "promote refused" in capsys.readouterr().err


def test_promote_refuses_a_color_that_fails_its_golden_vectors(kubectl, capsys):
    kubectl.use(cluster(idle_actions=[1, 1]))
    assert run_rollout("promote") == 1
    assert service_patches(kubectl) == []
    assert "golden vectors" in capsys.readouterr().err


def test_promote_refuses_a_new_version_that_disagrees_with_the_live_one(kubectl, capsys):
    kubectl.use(cluster(live_actions=[1, 0]))
    assert run_rollout("promote") == 1
    assert service_patches(kubectl) == []
    assert "action agreement with live" in capsys.readouterr().err


def test_the_agreement_threshold_is_an_option(kubectl):
    kubectl.use(cluster(live_actions=[1, 0]))
    assert run_rollout("promote", "--min-agreement", "0") == 0
    assert len(service_patches(kubectl)) == 1


def test_verify_sends_both_versions_the_same_observations(kubectl, capsys):
    kubectl.use(cluster())
    assert run_rollout("verify", "green") == 0
    posts = [c for c in kubectl.calls() if verb(c) == "create"]
    preview = {
        json.dumps(b)
        for c, b in zip(posts, kubectl.bodies(), strict=True)
        if "rlserve-preview:http" in c[3]
    }
    live = {
        json.dumps(b)
        for c, b in zip(posts, kubectl.bodies(), strict=True)
        if "/services/rlserve:http" in c[3]
    }
    assert live
    assert live <= preview
    assert "PASS  action agreement with live" in capsys.readouterr().out


def test_verify_with_canary_needs_the_live_colors_canary_of_the_version_to_say_promote(
    kubectl, capsys
):
    cases = [
        (canary_status(4, "promote"), 0, "PASS  canary judged by return: version 4: promote"),
        (canary_status(4, "continue"), 1, "FAIL  canary judged by return: version 4: continue"),
        (canary_status(4, "rollback"), 1, "FAIL  canary judged by return: version 4: rollback"),
        (canary_status(5, "promote"), 1, "canary is version 5, not 4"),
        (None, 1, "no canary of model cartpole runs on the live color"),
    ]
    for status, code, words in cases:
        kubectl.use(cluster(canary=status))
        assert run_rollout("verify", "green", "--canary") == code
        assert words in capsys.readouterr().out
    asked = sum("/canary" in " ".join(c) for c in kubectl.calls())
    kubectl.use(cluster(canary=None))
    assert run_rollout("verify", "green") == 0  # without --canary: not asked
    assert sum("/canary" in " ".join(c) for c in kubectl.calls()) == asked


def test_rollback_is_a_single_patch_of_the_service(kubectl):
    kubectl.use(cluster())
    assert run_rollout("rollback") == 0
    (only,) = mutations(kubectl)
    assert verb(only) == "patch"
    assert "rlserve" in only
    assert "service" in only
    assert patch_body(only)["spec"] == {"selector": {"color": "green"}}


def test_rollback_refuses_a_color_without_ready_pods(kubectl, capsys):
    kubectl.use(cluster(idle_ready=0))
    assert run_rollout("rollback") == 1
    assert mutations(kubectl) == []
    assert "no ready pods" in capsys.readouterr().err


def test_deploy_refuses_the_active_color(kubectl, capsys):
    kubectl.use(cluster())
    assert run_rollout("deploy", "blue", "--image", "rlserve:2", "--model-version", "5") == 2
    assert mutations(kubectl) == []
    assert "blue is the active color" in capsys.readouterr().err


def test_deploy_sets_image_and_version_of_the_idle_color_and_previews_it(kubectl):
    kubectl.use(cluster())
    assert run_rollout("deploy", "green", "--image", "rlserve:2", "--model-version", "5") == 0
    calls = mutations(kubectl)
    body = patch_body(calls[position(calls, "patch deployment rlserve-green")])
    (container,) = body["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "rlserve:2"
    assert container["env"] == [{"name": "RLSERVE_VERSION_POLICY", "value": '{"specific":[5]}'}]
    assert body["metadata"]["annotations"]["rlserve.io/model-version"] == "5"
    assert patch_body(calls[position(calls, "patch service rlserve-preview")])["spec"] == {
        "selector": {"color": "green"}
    }


def test_retire_waits_for_the_rollback_window(kubectl, capsys):
    scenario = cluster()
    scenario["rules"].insert(0, {"when": ["rollback-until"], "stdout": "2999-01-01T00:00:00Z"})
    kubectl.use(scenario)
    assert run_rollout("retire") == 2
    assert mutations(kubectl) == []
    assert "--force" in capsys.readouterr().err
    assert run_rollout("retire", "--force") == 0
    assert mutations(kubectl)[-1][1:] == ["scale", "deployment/rlserve-green", "--replicas=0"]


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["deploy", "green", "--image", "rlserve:2", "--model-version", "5"],
        ["verify", "green"],
        ["promote"],
        ["rollback"],
        ["retire"],
    ],
)
def test_dry_run_prints_every_command_and_runs_none(kubectl, capsys, argv):
    kubectl.use(cluster())
    assert run_rollout(*argv, "--dry-run") == 0
    assert kubectl.calls() == []
    assert "kubectl --namespace=rlserve" in capsys.readouterr().out


def make_repository(root: Path, versions: range) -> Path:
    for version in versions:
        (root / "cartpole" / str(version)).mkdir(parents=True)
        (root / "cartpole" / str(version) / "model.onnx").write_bytes(b"onnx")
    return root


def on_disk(root: Path) -> list[int]:
    return sorted(int(p.name) for p in (root / "cartpole").iterdir())


def test_retention_keeps_the_newest_and_never_deletes_a_version_a_color_serves(kubectl, tmp_path):
    kubectl.use(cluster())  # blue serves 3, green serves 4
    repo = make_repository(tmp_path / "models", range(1, 8))
    argv = ["retain", "--model-repository", str(repo), "--model", "cartpole", "--keep", "2"]
    assert run_rollout(*argv) == 0
    assert on_disk(repo) == [3, 4, 6, 7]


def test_retention_deletes_nothing_when_it_cannot_see_the_colors(kubectl, tmp_path):
    kubectl.use({"rules": [{"when": ["get deployments"], "json": {"items": []}}]})
    repo = make_repository(tmp_path / "models", range(1, 8))
    argv = ["retain", "--model-repository", str(repo), "--model", "cartpole", "--keep", "1"]
    assert run_rollout(*argv) == 2
    assert on_disk(repo) == list(range(1, 8))


def test_retention_dry_run_deletes_nothing_and_runs_nothing(kubectl, tmp_path, capsys):
    kubectl.use(cluster())
    repo = make_repository(tmp_path / "models", range(1, 8))
    argv = ["retain", "--model-repository", str(repo), "--model", "cartpole", "--dry-run"]
    assert run_rollout(*argv) == 0
    assert on_disk(repo) == list(range(1, 8))
    assert kubectl.calls() == []
    assert "rm -r" in capsys.readouterr().out


def test_the_kubectl_binary_is_an_option(kubectl, tmp_path, capsys):
    assert run_rollout("rollback", "--kubectl", str(tmp_path / "nowhere" / "kubectl")) == 2
    assert "--kubectl PATH" in capsys.readouterr().err


def test_rollout_is_a_subcommand_of_rlserve():
    assert "ops.commands.rollout" in cli._SUBCOMMANDS


def test_status_shows_the_live_color_and_each_colors_version_and_readiness(kubectl, capsys):
    def deployment(version: str, ready: int) -> dict:
        notes = {"rlserve.io/model-version": version}
        containers = [{"name": "server", "image": f"rlserve:{version}"}]
        spec = {"replicas": 3, "template": {"spec": {"containers": containers}}}
        return {
            "metadata": {"annotations": notes},
            "spec": spec,
            "status": {"readyReplicas": ready},
        }

    service = {"metadata": {"annotations": {}}, "spec": {"selector": {"color": "blue"}}}
    kubectl.use(
        {
            "rules": [
                {"when": ["get service rlserve -o json"], "json": service},
                {"when": ["deployment rlserve-blue -o json"], "json": deployment("3", 3)},
                {"when": ["deployment rlserve-green -o json"], "json": deployment("4", 0)},
                {"when": ["get hpa"], "json": {"spec": {"minReplicas": 2}}},
            ]
        }
    )
    assert run_rollout("status") == 0
    out = capsys.readouterr().out
    assert "selects blue" in out
    assert "blue   active  3/3    ready" in out
    assert "green  idle    0/3    NOT ready  v4" in out
