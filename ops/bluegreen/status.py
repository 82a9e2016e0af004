"""``rlserve rollout status``: which color is live, and how each color stands."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ops.bluegreen.kubectl import Kubectl
from ops.bluegreen.names import ACTIVE_COLOR, MODEL_VERSION, ROLLBACK_UNTIL
from ops.bluegreen.switch import Color


class Role(StrEnum):
    ACTIVE = "active"
    IDLE = "idle"


@dataclass(frozen=True)
class ColorStatus:
    color: Color
    role: Role
    replicas: int
    ready: int
    image: str
    model_version: str
    hpa_floor: str

    @property
    def is_ready(self) -> bool:
        return self.ready > 0 and self.ready >= self.replicas

    def row(self) -> str:
        readiness = "ready" if self.is_ready else "NOT ready"
        return (
            f"{self.color:<6} {self.role:<7} {self.ready}/{self.replicas:<4} {readiness:<10} "
            f"v{self.model_version:<8} min {self.hpa_floor:<4} {self.image}"
        )


def status(k: Kubectl) -> list[ColorStatus]:
    """Every color's state; empty in a dry run (the commands are printed instead)."""
    service = k.document("get", "service", k.names.service, "-o", "json")
    documents = {c: _color_documents(k, c) for c in Color}
    if service is None:
        return []
    active = service.get("spec", {}).get("selector", {}).get("color")
    k.say(f"service/{k.names.service} selects {active} ({_note(service)})")
    rows = [_status(c, active, *documents[c]) for c in Color]
    for row in rows:
        k.say(row.row())
    return rows


def _color_documents(k: Kubectl, color: Color) -> tuple[dict[str, Any], dict[str, Any]]:
    name = k.names.workload(color)
    deployment = k.document("get", "deployment", name, "-o", "json") or {}
    hpa = k.document("get", "hpa", name, "-o", "json") or {}
    return deployment, hpa


def _status(
    color: Color, active: str, deployment: dict[str, Any], hpa: dict[str, Any]
) -> ColorStatus:
    spec = deployment.get("spec", {})
    containers = spec.get("template", {}).get("spec", {}).get("containers", [{}])
    return ColorStatus(
        color=color,
        role=Role.ACTIVE if color == active else Role.IDLE,
        replicas=int(spec.get("replicas") or 0),
        ready=int(deployment.get("status", {}).get("readyReplicas") or 0),
        image=str(containers[0].get("image", "?")),
        model_version=str(_annotations(deployment).get(MODEL_VERSION, "?")),
        hpa_floor=str(hpa.get("spec", {}).get("minReplicas", "?")),
    )


def _note(service: dict[str, Any]) -> str:
    notes = _annotations(service)
    recorded = notes.get(ACTIVE_COLOR, "not recorded")
    until = notes.get(ROLLBACK_UNTIL)
    return f"recorded active: {recorded}" + (f", rollback window until {until}" if until else "")


def _annotations(document: dict[str, Any]) -> dict[str, str]:
    return document.get("metadata", {}).get("annotations") or {}
