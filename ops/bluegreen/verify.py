"""Is a color fit for production? The checks behind ``rlserve rollout verify`` and ``promote``.

In order: the Deployment finished rolling out; the preview Service selects the color and
has ready endpoints; ``/ready`` answers 200 through it; the served model reproduces its
contract's golden vectors (discrete actions exactly, floats within the contract's
``golden_atol``); and, when the live color serves another model version, both versions get
the same observations and the share of rows whose actions agree must reach a threshold;
with ``--canary``, the live color's policy canary of the new version must say promote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kernel import contract
from kernel.contract import PolicyContract, TensorRole
from kernel.errors import MalformedRequest, NotFound
from ops.bluegreen.kubectl import Kubectl
from ops.bluegreen.names import MODEL_VERSION, annotation
from ops.errors import KubectlError


@dataclass(frozen=True)
class VerifyOptions:
    model: str | None = None  # default: the Deployment's RLSERVE_DEFAULT_MODEL
    min_agreement: float = 0.9
    action_atol: float = 0.05
    timeout_s: int = 600
    canary: bool = False  # also require the live color's canary of this version to say promote


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    color: str
    checks: list[Check] = field(default_factory=list)
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.ok]

    def text(self) -> str:
        if self.dry_run:
            return f"# verify {self.color}: a dry run checks nothing"
        lines = [f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in self.checks]
        verdict = "fit for production" if self.ok else "NOT fit for production"
        return "\n".join([*lines, f"{self.color}: {verdict}"])


@dataclass(frozen=True)
class Target:
    """One model version behind one Service."""

    service: str
    model: str
    version: str

    def path(self, k: Kubectl, suffix: str = "") -> str:
        return k.names.proxy(self.service, f"/v1/models/{self.model}{suffix}")

    def predict_path(self, k: Kubectl) -> str:
        return self.path(k, f"/versions/{self.version}/predict")


def verify(k: Kubectl, color: str, options: VerifyOptions) -> Report:
    report = Report(color, dry_run=k.dry_run)
    _serving(k, color, options, report)
    if not report.ok:
        return report
    target = Target(k.names.preview, _model(k, color, options), _version(k, color))
    policy = _contract(k, target)
    if policy is None:
        k.say("# then one POST per golden vector, and for another live version the same")
        k.say("# observations to both Services, comparing their actions")
        return report
    report.checks.append(_golden(k, target, policy))
    agreement = _agreement(k, color, target, policy, options)
    if agreement is not None:
        report.checks.append(agreement)
    if options.canary:
        report.checks.append(_canary_verdict(k, target))
    return report


def _serving(k: Kubectl, color: str, options: VerifyOptions, report: Report) -> None:
    name, preview = k.names.workload(color), k.names.preview
    done = k.succeeds("rollout", "status", f"deployment/{name}", f"--timeout={options.timeout_s}s")
    report.add("rollout complete", done, f"deployment/{name} (waited up to {options.timeout_s}s)")
    selected = k.field("PREVIEW", "service", preview, "{.spec.selector.color}")
    detail = f"service/{preview} selects {selected or 'no color'}"
    report.add("preview selects it", k.dry_run or selected == color, detail)
    label = f"kubernetes.io/service-name={preview}"
    slices = k.document("get", "endpointslices", "-l", label, "-o", "json")
    ready = _ready_endpoints(slices)
    report.add("ready endpoints", k.dry_run or ready > 0, f"{ready} behind service/{preview}")
    answered = k.succeeds("get", "--raw", k.names.proxy(preview, "/ready"))
    report.add("/ready through the preview", answered, f"GET /ready via service/{preview}")


def _ready_endpoints(slices: dict[str, Any] | None) -> int:
    items = (slices or {}).get("items", [])
    endpoints = [e for s in items for e in s.get("endpoints") or []]
    return sum(1 for e in endpoints if (e.get("conditions") or {}).get("ready"))


def _model(k: Kubectl, color: str, options: VerifyOptions) -> str:
    if options.model:
        return options.model
    env = '{.spec.template.spec.containers[0].env[?(@.name=="RLSERVE_DEFAULT_MODEL")].value}'
    name = k.field("MODEL", "deployment", k.names.workload(color), env)
    if not name:
        raise MalformedRequest(
            f"verify: deployment/{k.names.workload(color)} sets no RLSERVE_DEFAULT_MODEL; "
            "pass --model NAME"
        )
    return name


def _version(k: Kubectl, color: str) -> str:
    path = annotation(MODEL_VERSION)
    version = k.field("VERSION", "deployment", k.names.workload(color), path)
    if not k.dry_run and not version.isdigit():
        raise MalformedRequest(
            f"verify: deployment/{k.names.workload(color)} has annotation "
            f"rlserve.io/model-version={version!r}, expected a version number; "
            "set it with `rlserve rollout deploy`"
        )
    return version


def _contract(k: Kubectl, target: Target) -> PolicyContract | None:
    described = k.document("get", "--raw", target.path(k))
    if described is None:
        return None
    for entry in described.get("versions", []):
        if str(entry.get("version")) == target.version:
            origin = f"model {target.model} version {target.version} via service/{target.service}"
            return contract.parse(json.dumps(entry.get("contract")), origin)
    raise NotFound(
        f"verify: service/{target.service} does not serve model {target.model!r} version "
        f"{target.version}; it serves {[v.get('version') for v in described.get('versions', [])]}"
    )


def _golden(k: Kubectl, target: Target, policy: PolicyContract) -> Check:
    action = policy.output(TensorRole.ACTION)
    name = action.name if action else "action"
    atol = policy.golden_atol
    misses = [
        i
        for i, golden in enumerate(policy.golden)
        if not same(golden.outputs.get(name), _actions(k, target, golden.observations), atol)
    ]
    total = len(policy.golden)
    detail = f"{total - len(misses)} of {total} reproduced by version {target.version}" + (
        f"; vectors {misses} differ" if misses else ""
    )
    return Check("golden vectors", total > 0 and not misses, detail)


def _agreement(
    k: Kubectl, color: str, target: Target, policy: PolicyContract, options: VerifyOptions
) -> Check | None:
    live = k.field("LIVE", "service", k.names.service, "{.spec.selector.color}")
    if live == color:
        return None
    live_target = Target(k.names.service, target.model, _version(k, live))
    if live_target.version == target.version:
        return None
    live_policy = _contract(k, live_target) or policy
    observations = [g.observations for g in [*policy.golden, *live_policy.golden]]
    pairs = _paired_rows(k, target, live_target, observations)
    agree = sum(1 for new, old in pairs if same(old, new, options.action_atol))
    rate = agree / len(pairs) if pairs else 0.0
    detail = (
        f"{agree} of {len(pairs)} rows ({rate:.1%}) act alike in version {target.version} and "
        f"the live version {live_target.version} ({live}); needed {options.min_agreement:.0%}"
        f", continuous actions within {options.action_atol:g}"
    )
    return Check("action agreement with live", rate >= options.min_agreement, detail)


def _canary_verdict(k: Kubectl, target: Target) -> Check:
    """The live color's policy canary of the new version: its gate must say promote (the
    returns its episodes earned beside the live version's: docs/rollouts.md)."""
    name = "canary judged by return"
    path = k.names.proxy(k.names.service, f"/v1/models/{target.model}/canary")
    try:
        status = k.document("get", "--raw", path)
    except KubectlError:
        return Check(
            name, False,
            f"no canary of model {target.model} runs on the live color; start one of version "
            f"{target.version} there (rlserve rollout canary start {target.model} --version "
            f"{target.version}) and let its episodes decide",
        )  # fmt: skip
    if status is None:  # a dry run
        return Check(name, True, "a dry run asks nothing")
    version, verdict = str(status["canary"]["version"]), status.get("verdict")
    if version != target.version:
        return Check(
            name, False, f"the live color's canary is version {version}, not {target.version}"
        )
    detail = f"version {version}: {verdict} ({status.get('reason', '')})"
    return Check(name, verdict == "promote", detail)


def _paired_rows(
    k: Kubectl, new: Target, old: Target, observations: list[Any]
) -> list[tuple[Any, Any]]:
    """Each row's action from both versions, on the same observations."""
    return [
        pair for obs in observations for pair in _rows(_actions(k, new, obs), _actions(k, old, obs))
    ]


def _actions(k: Kubectl, target: Target, observations: Any) -> Any:
    answer = k.post(target.predict_path(k), {"observations": observations, "deterministic": True})
    return (answer or {}).get("actions")


def _rows(new: Any, old: Any) -> list[tuple[Any, Any]]:
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return list(zip(new, old, strict=True))
    return [(new, old)]


def same(expected: Any, actual: Any, atol: float) -> bool:
    """Equal as actions: integers exactly, floats within ``atol``, nested alike."""
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(same(v, actual[key], atol) for key, v in expected.items())
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(same(e, a, atol) for e, a in zip(expected, actual, strict=True))
        )
    if isinstance(expected, float) and isinstance(actual, int | float):
        return abs(float(actual) - expected) <= atol
    return bool(expected == actual)
