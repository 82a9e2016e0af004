"""Canned clusters for the rollout tool's tests: scenario rules for tests/ops/fake_kubectl.py.

The cluster: blue is live at 3 replicas serving model ``cartpole`` version 3; green is idle
with version 4 deployed and ready. Both versions' contracts carry one golden vector.
"""

from __future__ import annotations

from typing import Any

from kernel.contract import PolicyContract

MODEL = "cartpole"
GOLDEN_OBSERVATIONS = [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]
GOLDEN_ACTIONS = [0, 1]


def contract(version: int) -> dict[str, Any]:
    """A valid policy contract (CartPole-like) whose golden actions are GOLDEN_ACTIONS."""
    raw = {
        "schema": "rlserve.policy/v1",
        "algorithm": "ppo",
        "source": {
            "framework": "stable-baselines3",
            "framework_version": "2.3.0",
            "checkpoint": "ppo.zip",
            "sha256": "0" * 64,
            "policy_class": "PolicyVersion",
        },
        "observation_space": {"type": "Box", "shape": [4], "low": -10.0, "high": 10.0},
        "action_space": {"type": "Discrete", "n": 2},
        "inputs": [
            {"name": "obs", "role": "observation", "dtype": "float32", "shape": ["batch", 4]}
        ],
        "outputs": [
            {"name": "action", "role": "action", "dtype": "int64", "shape": ["batch"]},
            {"name": "logits", "role": "logits", "dtype": "float32", "shape": ["batch", 2]},
        ],
        "distribution": {"kind": "categorical"},
        "preprocessing": {"action_clip": False},
        "policy_version": version,
        "exporter": {"version": "0.1.0"},
        "opset": 17,
        "created_at": "2026-11-01T00:00:00Z",
        "golden": [{"observations": GOLDEN_OBSERVATIONS, "outputs": {"action": GOLDEN_ACTIONS}}],
    }
    return PolicyContract.model_validate(raw).model_dump(mode="json", by_alias=True)


def _rule(*when: str, **answer: Any) -> dict[str, Any]:
    return {"when": list(when), **answer}


def _describe(version: int) -> dict[str, Any]:
    return {"name": MODEL, "versions": [{"version": version, "contract": contract(version)}]}


def cluster(
    *,
    idle_rollout_ok: bool = True,
    idle_actions: list[int] = GOLDEN_ACTIONS,
    live_actions: list[int] = GOLDEN_ACTIONS,
    idle_ready: int = 3,
    idle_version: int = 4,
    canary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    preview = "rlserve-preview:http/proxy"
    live = "/services/rlserve:http/proxy"
    ready = {"conditions": {"ready": True}}
    rules = [
        _rule("get service rlserve -o", "selector.color", stdout="blue"),
        _rule("get service rlserve -o", "rollback-until", stdout=""),
        _rule("get service rlserve-preview", "selector.color", stdout="green"),
        _rule("deployment rlserve-blue", "{.spec.replicas}", stdout="3"),
        _rule("deployment rlserve-green", "{.spec.replicas}", stdout="1"),
        _rule("deployment rlserve-green", "readyReplicas", stdout=str(idle_ready)),
        _rule("hpa rlserve-", "{.spec.minReplicas}", stdout="2"),
        _rule("hpa rlserve-", "restore-min-replicas", stdout=""),
        _rule("rollout status deployment/rlserve-green", rc=0 if idle_rollout_ok else 1),
        _rule("get endpointslices", json={"items": [{"endpoints": [ready, ready]}]}),
        _rule("get --raw", f"{preview}/ready"),
        _rule("RLSERVE_DEFAULT_MODEL", stdout=MODEL),
        _rule("deployment rlserve-green", "model-version", stdout=str(idle_version)),
        _rule("deployment rlserve-blue", "model-version", stdout="3"),
        # the live color's policy canary (before the model's own path, which it extends)
        _rule("get --raw", f"{live}/v1/models/{MODEL}/canary", **_canary(canary)),
        _rule("get --raw", f"{preview}/v1/models/{MODEL}", json=_describe(idle_version)),
        _rule("get --raw", f"{live}/v1/models/{MODEL}", json=_describe(3)),
        _rule("create --raw", f"{preview}/v1/models/", json={"actions": idle_actions}),
        _rule("create --raw", f"{live}/v1/models/", json={"actions": live_actions}),
        _rule("get deployments -l app=rlserve", json=_deployments()),
    ]
    return {"rules": rules}


def _canary(status: dict[str, Any] | None) -> dict[str, Any]:
    """The answer to a GET of the live color's canary: its status, or a 404 (kubectl fails)."""
    if status is None:
        return {"rc": 1, "stderr": "Error from server (NotFound): the server could not find"}
    return {"json": status}


def canary_status(version: int, verdict: str) -> dict[str, Any]:
    """A canary's status as the server answers it (the fields verify reads)."""
    return {"model": MODEL, "canary": {"version": version, "share": 0.1}, "verdict": verdict,
            "reason": f"canary - live in [1, 2] at 95%: {verdict}"}  # fmt: skip


def _deployments() -> dict[str, Any]:
    """The two Deployments as retention reads them: blue serves 3, green serves 4."""
    return {"items": [_deployment("blue", 3), _deployment("green", 4)]}


def _deployment(color: str, version: int) -> dict[str, Any]:
    env = [{"name": "RLSERVE_VERSION_POLICY", "value": f'{{"specific":[{version}]}}'}]
    return {
        "metadata": {
            "name": f"rlserve-{color}",
            "annotations": {"rlserve.io/model-version": str(version)},
        },
        "spec": {"template": {"spec": {"containers": [{"name": "server", "env": env}]}}},
    }
