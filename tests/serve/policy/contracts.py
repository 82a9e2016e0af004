"""Policy contracts written by hand, for the unit tests of validation and policy heads."""

from __future__ import annotations

from typing import Any

from kernel.contract import PolicyContract


def contract(observation_space: dict[str, Any], action_space: dict[str, Any]) -> PolicyContract:
    """A contract for one observation leaf and one action space, as the exporter writes it."""
    kind, params = _distribution(action_space)
    outputs = [
        {"name": "action", "role": "action", "dtype": "float32", "shape": ["batch"]},
        *({"name": p, "role": p, "dtype": "float32", "shape": ["batch", 1]} for p in params),
        {"name": "value", "role": "value", "dtype": "float32", "shape": ["batch"]},
    ]
    return PolicyContract.model_validate(
        {
            "schema": "rlserve.policy/v1",
            "algorithm": "ppo",
            "source": {
                "framework": "test",
                "framework_version": "0",
                "checkpoint": "none",
                "sha256": "0" * 64,
                "policy_class": "test",
            },
            "observation_space": observation_space,
            "action_space": action_space,
            "inputs": [{"name": "obs", "role": "observation", "dtype": "float32", "shape": []}],
            "outputs": outputs,
            "distribution": {"kind": kind, "nvec": action_space.get("nvec")},
            "preprocessing": {"action_clip": action_space["type"] == "Box"},
            "policy_version": 1,
            "exporter": {"version": "0"},
            "opset": 18,
            "created_at": "2026-01-01T00:00:00+00:00",
            "golden": [],
        }
    )


def _distribution(action_space: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    kind = action_space["type"]
    if kind == "Discrete":
        return "categorical", ("logits",)
    if kind == "MultiDiscrete":
        return "multi_categorical", ("logits",)
    if kind == "MultiBinary":
        return "bernoulli", ("logits",)
    return "diag_gaussian", ("mean", "log_std")
