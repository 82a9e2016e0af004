"""``rlserve rollout VERB``: blue-green releases of rlserve on Kubernetes, through kubectl,
and policy canaries on a server.

Verbs: status, deploy, verify, promote, rollback, retire, retain (see docs/blue-green.md);
``canary start|status|promote|rollback`` (``ops.canary``, docs/rollouts.md).
A check that fails (verification, a color without ready pods) exits 1 with one line; a
usage error or a kubectl failure exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cli.arguments import add_arguments as add_dataclass_arguments
from cli.arguments import arg, from_namespace
from ops import canary
from ops.bluegreen import retain, status, switch
from ops.bluegreen.kubectl import Kubectl, Names
from ops.bluegreen.switch import Color, PromoteOptions
from ops.bluegreen.verify import VerifyOptions, verify
from ops.errors import CheckFailed

NAME = "rollout"
HELP = (
    "blue-green releases on Kubernetes (status, deploy, verify, promote, rollback, retire) "
    "and policy canaries judged by return (canary start, status, promote, rollback)"
)
EXTRA = None


@dataclass
class CommonArgs:
    namespace: str = field(default="rlserve", metadata=arg("namespace of rlserve's objects"))
    kubectl: str = field(default="kubectl", metadata=arg("the kubectl binary to run"))
    dry_run: bool = field(
        default=False, metadata=arg("print every kubectl command instead of running any")
    )


@dataclass
class ColorArgs:
    color: Color = field(metadata=arg("blue or green", positional=True))


@dataclass
class DeployArgs:
    color: Color = field(metadata=arg("the idle color to deploy to", positional=True))
    image: str = field(metadata=arg("the container image, e.g. registry/rlserve:0.2.0-gpu"))
    model_version: int = field(metadata=arg("the model version the color serves"))


@dataclass
class CheckArgs:
    model: str | None = field(
        default=None, metadata=arg("model to check (default: the Deployment's default model)")
    )
    min_agreement: float = field(
        default=0.9, metadata=arg("share of rows whose actions must agree with the live version")
    )
    action_atol: float = field(
        default=0.05, metadata=arg("continuous actions closer than this count as agreeing")
    )
    timeout_s: int = field(default=600, metadata=arg("longest wait for a rollout to finish"))
    canary: bool = field(
        default=False,
        metadata=arg(
            "also require the live color's policy canary of the new version to say promote "
            "(its episodes' returns against the live version's; docs/rollouts.md)"
        ),
    )


@dataclass
class PromoteArgs:
    rollback_window_min: int = field(
        default=30, metadata=arg("minutes the old color stays warm for a rollback")
    )


@dataclass
class RetireArgs:
    force: bool = field(default=False, metadata=arg("retire before the rollback window ends"))


@dataclass
class RetainArgs:
    model_repository: Path = field(metadata=arg("the model repository (Triton layout)"))
    model: str = field(metadata=arg("the model whose versions to prune"))
    keep: int = field(default=3, metadata=arg("newest versions to keep"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, (help_text, groups, handler) in _VERBS.items():
        child = verbs.add_parser(name, help=help_text, description=help_text)
        for group in (*groups, CommonArgs):
            add_dataclass_arguments(child, group)
        child.set_defaults(_verb=handler)
    help_text = "a policy canary on a server, judged by the returns its episodes earn"
    canaries = verbs.add_parser("canary", help=help_text, description=help_text)
    canary.add_arguments(canaries)


def run(namespace: argparse.Namespace) -> int:
    if namespace.verb == "canary":
        return _canary(namespace)
    handler: Callable[[argparse.Namespace, Kubectl], int] = namespace._verb
    common = from_namespace(CommonArgs, namespace)
    k = Kubectl(common.kubectl, Names(namespace=common.namespace), common.dry_run)
    try:
        return handler(namespace, k)
    except CheckFailed as exc:
        print(f"rlserve rollout: {exc.message}", file=sys.stderr)
        return 1


def _canary(namespace: argparse.Namespace) -> int:
    try:
        return canary.run(namespace)
    except CheckFailed as exc:
        print(f"rlserve rollout canary: {exc.message}", file=sys.stderr)
        return 1


def _status(namespace: argparse.Namespace, k: Kubectl) -> int:
    rows = status.status(k)
    live = [r for r in rows if r.role is status.Role.ACTIVE]
    return 0 if k.dry_run or all(r.is_ready for r in live) else 1


def _deploy(namespace: argparse.Namespace, k: Kubectl) -> int:
    args = from_namespace(DeployArgs, namespace)
    switch.deploy(k, args.color, args.image, args.model_version)
    return 0


def _verify(namespace: argparse.Namespace, k: Kubectl) -> int:
    color = from_namespace(ColorArgs, namespace).color
    report = verify(k, color.value, _verify_options(namespace))
    k.say(report.text())
    return 0 if report.ok else 1


def _promote(namespace: argparse.Namespace, k: Kubectl) -> int:
    window = timedelta(minutes=from_namespace(PromoteArgs, namespace).rollback_window_min)
    options = PromoteOptions(_verify_options(namespace), window)
    switch.promote(k, options, datetime.now(UTC))
    return 0


def _rollback(namespace: argparse.Namespace, k: Kubectl) -> int:
    switch.rollback(k)
    return 0


def _retire(namespace: argparse.Namespace, k: Kubectl) -> int:
    switch.retire(k, datetime.now(UTC), from_namespace(RetireArgs, namespace).force)
    return 0


def _retain(namespace: argparse.Namespace, k: Kubectl) -> int:
    args = from_namespace(RetainArgs, namespace)
    retain.retain(k, args.model_repository, args.model, args.keep)
    return 0


def _verify_options(namespace: argparse.Namespace) -> VerifyOptions:
    args = from_namespace(CheckArgs, namespace)
    return VerifyOptions(
        args.model, args.min_agreement, args.action_atol, args.timeout_s, args.canary
    )


_Handler = Callable[[argparse.Namespace, Kubectl], int]
_VERBS: dict[str, tuple[str, tuple[type, ...], _Handler]] = {
    "status": ("active color, replicas, image, model version, readiness", (), _status),
    "deploy": ("roll an image and model version out to the idle color", (DeployArgs,), _deploy),
    "verify": ("check a color is fit for production", (ColorArgs, CheckArgs), _verify),
    "promote": (
        "pre-scale and verify the idle color, then switch the Service to it",
        (CheckArgs, PromoteArgs),
        _promote,
    ),
    "rollback": ("switch the Service back to the still-warm old color", (), _rollback),
    "retire": ("after the rollback window, scale the old color to zero", (RetireArgs,), _retire),
    "retain": (
        "delete old model versions, keeping the newest and any a color serves",
        (RetainArgs,),
        _retain,
    ),
}
