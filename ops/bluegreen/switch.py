"""Blue-green switching of rlserve on Kubernetes, built on ``kubectl`` alone.

Two Deployments (``rlserve-blue``, ``rlserve-green``), each with its own HPA, sit behind
the production Service ``rlserve`` (selector ``app`` + ``color``) and the preview Service
``rlserve-preview`` (the idle color). The procedure (docs/blue-green.md):

``deploy`` the idle color -> ``verify`` it -> ``promote`` (pre-scale, verify, switch, keep
the old color warm) -> ``rollback`` within the window if needed -> ``retire`` the old color.

A color is a :class:`Color`; in a dry run the active and idle colors are not known, so the
functions below pass colors on as names (``"blue"``, or ``"$ACTIVE"`` in a dry run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from kernel.errors import Conflict, RLServeError
from ops.bluegreen import verify as verification
from ops.bluegreen.kubectl import Count, Kubectl
from ops.bluegreen.names import (
    ACTIVE_COLOR,
    CONTAINER,
    MODEL_VERSION,
    PREVIOUS_COLOR,
    RESTORE_MIN,
    ROLLBACK_UNTIL,
    VERSION_POLICY_ENV,
    annotation,
)
from ops.errors import CheckFailed


class Color(StrEnum):
    BLUE = "blue"
    GREEN = "green"

    @property
    def other(self) -> Color:
        return Color.GREEN if self is Color.BLUE else Color.BLUE


@dataclass(frozen=True)
class PromoteOptions:
    verify: verification.VerifyOptions
    rollback_window: timedelta


def active_color(k: Kubectl) -> str:
    """The color the production Service selects."""
    text = k.field("ACTIVE", "service", k.names.service, "{.spec.selector.color}")
    if k.dry_run:
        return text
    if text not in {c.value for c in Color}:
        raise Conflict(
            f"service/{k.names.service}: spec.selector.color is {text!r}, expected blue or "
            "green; apply k8s/overlays/... first, or fix the selector by hand"
        )
    return text


def idle_color(k: Kubectl, active: str) -> str:
    if k.dry_run:
        k.say("# IDLE: the color that is not $ACTIVE")
        return "$IDLE"
    return Color(active).other.value


def deploy(k: Kubectl, color: Color, image: str, model_version: int) -> None:
    """Roll a new image and model version out to the idle color and preview it."""
    active = active_color(k)
    k.refuse_if(f"{color} is $ACTIVE", lambda: active == color, lambda: _active_error(k, color))
    name = k.names.workload(color)
    k.change("patch", "deployment", name, "--type=strategic", "-p", _release(image, model_version))
    k.change("patch", "service", k.names.preview, "--type=merge", "-p", _selects(color))
    replicas = k.number(k.field("REPLICAS", "deployment", name, "{.spec.replicas}"))
    if k.when(f"{name} was retired ($REPLICAS is 0)", lambda: replicas == 0):
        k.change("scale", f"deployment/{name}", "--replicas=1")
    k.say(f"deployed {image} (model version {model_version}) to {name}")
    k.say(f"next: rlserve rollout verify {color} --namespace {k.names.namespace}")


def _active_error(k: Kubectl, color: Color) -> RLServeError:
    return Conflict(
        f"deploy {color}: {color} is the active color (service/{k.names.service} selects "
        f"it); deploy to {color.other}, verify it, then promote"
    )


def promote(k: Kubectl, options: PromoteOptions, now: datetime) -> None:
    """Switch production to the idle color once it is as large as the active one and verified."""
    active = active_color(k)
    idle = idle_color(k, active)
    replicas = _replicas(k, active)
    _prescale(k, idle, replicas)
    _require_verified(k, idle, active, options.verify)
    _raise_floor(k, active, replicas, "ACTIVE")
    until = (now + options.rollback_window).strftime("%Y-%m-%dT%H:%M:%SZ")
    switch = _switch(idle, active, until)
    k.change("patch", "service", k.names.service, "--type=merge", "-p", switch)
    k.say(
        f"promoted: service/{k.names.service} selects {idle}; {active} stays warm at "
        f"{replicas} replicas until {until} (rlserve rollout rollback), then run "
        "`rlserve rollout retire`"
    )


def _prescale(k: Kubectl, idle: str, replicas: Count) -> None:
    """Bring the idle color to the active one's size before it takes the traffic."""
    _raise_floor(k, idle, replicas, "IDLE")
    name = k.names.workload(idle)
    running = k.number(k.field("RUNNING", "deployment", name, "{.spec.replicas}"))
    if k.when("$RUNNING < $REPLICAS", lambda: _below(running, replicas)):
        k.change("scale", f"deployment/{name}", f"--replicas={replicas}")
    k.change("patch", "service", k.names.preview, "--type=merge", "-p", _selects(idle))


def _require_verified(
    k: Kubectl, idle: str, active: str, options: verification.VerifyOptions
) -> None:
    report = verification.verify(k, idle, options)
    k.say(report.text())
    if not report.ok:
        raise CheckFailed(
            f"promote refused: {k.names.workload(idle)} failed verification "
            f"({', '.join(report.failed())}); service/{k.names.service} still selects {active}"
        )


def rollback(k: Kubectl) -> None:
    """Switch production back to the other, still-warm color: one patch of the Service."""
    active = active_color(k)
    target = idle_color(k, active)
    path = "{.status.readyReplicas}"
    ready = k.number(k.field("READY", "deployment", k.names.workload(target), path))
    k.refuse_if("$READY is 0", lambda: ready == 0, lambda: _not_ready_error(k, target))
    k.change("patch", "service", k.names.service, "--type=merge", "-p", _switch(target, active))
    k.say(f"rolled back: service/{k.names.service} selects {target}")


def _not_ready_error(k: Kubectl, target: str) -> RLServeError:
    return CheckFailed(
        f"rollback refused: {k.names.workload(target)} has no ready pods (retired?); "
        f"redeploy it with `rlserve rollout deploy {target} --image ... --model-version ...`"
    )


def retire(k: Kubectl, now: datetime, force: bool) -> None:
    """After the rollback window: scale the old color to zero and restore both HPA floors."""
    active = active_color(k)
    old = idle_color(k, active)
    until = k.field("UNTIL", "service", k.names.service, annotation(ROLLBACK_UNTIL))
    k.refuse_if(
        "the rollback window ($UNTIL) is still open",
        lambda: _still_open(until, now, force),
        lambda: _window_error(until),
    )
    for color, variable in ((active, "ACTIVE"), (old, "OLD")):
        _restore_floor(k, color, variable)
    k.change("scale", f"deployment/{k.names.workload(old)}", "--replicas=0")
    k.say(f"retired {k.names.workload(old)}: scaled to 0 (its HPA rests until the next deploy)")


def _window_error(until: str) -> RLServeError:
    return Conflict(
        f"retire: the rollback window is open until {until} (annotation {ROLLBACK_UNTIL}); "
        "wait for it to end, or pass --force to retire the old color now"
    )


def _still_open(until: str, now: datetime, force: bool) -> bool:
    if force or not until:
        return False
    return now < datetime.strptime(until, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _replicas(k: Kubectl, color: str) -> Count:
    """The active color's current size (at least 1): what the idle one must match."""
    count = k.number(k.field("REPLICAS", "deployment", k.names.workload(color), "{.spec.replicas}"))
    return max(count, 1) if isinstance(count, int) else count


def _raise_floor(k: Kubectl, color: str, replicas: Count, variable: str) -> None:
    """Set a color's HPA minReplicas, remembering the floor it had for `retire`."""
    name = k.names.workload(color)
    floor = k.field(f"{variable}_MIN", "hpa", name, "{.spec.minReplicas}")
    saved = k.field(f"{variable}_SAVED", "hpa", name, annotation(RESTORE_MIN))
    restore = f"${{{variable}_SAVED:-${variable}_MIN}}" if k.dry_run else saved or floor
    k.change("patch", "hpa", name, "--type=merge", "-p", _floor(restore, replicas))


def _restore_floor(k: Kubectl, color: str, variable: str) -> None:
    name = k.names.workload(color)
    saved = k.field(f"{variable}_SAVED", "hpa", name, annotation(RESTORE_MIN))
    if k.when(f"${variable}_SAVED is set", lambda: bool(saved)):
        k.change("patch", "hpa", name, "--type=merge", "-p", _floor(None, k.number(saved)))


def _floor(restore: str | None, replicas: Count) -> str:
    """An HPA merge patch: its minReplicas, and the floor to restore later (None: forget)."""
    notes: dict[str, str | None] = {RESTORE_MIN: restore}
    spec: dict[str, Count] = {"minReplicas": replicas}
    return json.dumps({"metadata": {"annotations": notes}, "spec": spec})


def _below(running: Count, wanted: Count) -> bool:
    return isinstance(running, int) and isinstance(wanted, int) and running < wanted


def _release(image: str, model_version: int) -> str:
    version = {MODEL_VERSION: str(model_version)}
    policy = json.dumps({"specific": [model_version]}, separators=(",", ":"))
    env = [{"name": VERSION_POLICY_ENV, "value": policy}]
    container: dict[str, object] = {"name": CONTAINER, "image": image, "env": env}
    template = {"metadata": {"annotations": version}, "spec": {"containers": [container]}}
    return json.dumps({"metadata": {"annotations": version}, "spec": {"template": template}})


def _selects(color: str) -> str:
    return json.dumps({"spec": {"selector": {"color": color}}})


def _switch(to: str, away_from: str, until: str | None = None) -> str:
    """One merge patch: the selector's color (app is kept) and the record of the switch."""
    notes = {ACTIVE_COLOR: to, PREVIOUS_COLOR: away_from, ROLLBACK_UNTIL: until}
    return json.dumps({"metadata": {"annotations": notes}, "spec": {"selector": {"color": to}}})
