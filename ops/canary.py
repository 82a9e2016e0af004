"""``rlserve rollout canary ACTION``: a policy canary on a running server, over its HTTP API
(docs/rollouts.md).

Actions: ``start`` (a version serves a share of episodes beside the live one), ``status``
(both versions' returns, the interval for their difference and the gate's verdict),
``promote`` and ``rollback``. ``start --shadow`` runs the canary on mirrored live batches
instead, reported as action agreement and KL. ``start``, ``promote`` and ``rollback`` need
the server's admin token, from RLSERVE_ADMIN_TOKEN (never a flag: a command line is seen
by every user of the machine). ``status`` exits 0 while the gate waits or says promote, 1
when it says roll back, so a pipeline can act on it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cli.arguments import add_arguments as add_dataclass_arguments
from cli.arguments import arg, from_namespace
from ops.errors import CheckFailed

if TYPE_CHECKING:
    from client import PolicyClient

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass
class ServerArgs:
    model: str = field(metadata=arg("the model whose canary it is", positional=True))
    url: str | None = field(
        default=None, metadata=arg(f"the server (default: RLSERVE_URL, else {DEFAULT_URL})")
    )


@dataclass
class StartArgs:
    version: int = field(metadata=arg("the version to serve as the canary"))
    share: float = field(
        default=0.1, metadata=arg("the share of episodes the canary serves, in (0, 1)")
    )
    auto: bool = field(
        default=False,
        metadata=arg("let the gate promote or roll back on its verdict (else: report only)"),
    )
    shadow: bool = field(
        default=False,
        metadata=arg(
            "serve no episode on it: run it on --share of the live version's batches and "
            "report action agreement and KL to the live version"
        ),
    )
    margin: float = field(
        default=0.0,
        metadata=arg("how much lower the canary's mean return may be and still be promoted"),
    )
    alpha: float = field(
        default=0.05, metadata=arg("the chance of a wrong verdict over the whole canary")
    )
    min_episodes: int = field(
        default=30, metadata=arg("episodes on each version before any verdict")
    )
    planned_episodes: int = field(
        default=1000,
        metadata=arg("episodes (both versions) at which the gate's interval is narrowest"),
    )


TOKEN_HELP = (
    "start, promote and rollback need the server's admin token: set RLSERVE_ADMIN_TOKEN "
    "(it has no flag: a command line is seen by every user of the machine)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = TOKEN_HELP
    actions = parser.add_subparsers(dest="canary_action", required=True, metavar="ACTION")
    for name, (help_text, groups, _) in ACTIONS.items():
        child = actions.add_parser(name, help=help_text, description=help_text, epilog=TOKEN_HELP)
        for group in (*groups, ServerArgs):
            add_dataclass_arguments(child, group)


def run(namespace: argparse.Namespace) -> int:
    from client import PolicyClient, RequestFailed  # not for --help: it imports httpx

    _, _, handler = ACTIONS[namespace.canary_action]
    server = from_namespace(ServerArgs, namespace)
    url = server.url or os.environ.get("RLSERVE_URL", DEFAULT_URL)
    # a secret on a command line is seen by every user of the machine (ps): no flag for it
    token = os.environ.get("RLSERVE_ADMIN_TOKEN")
    with PolicyClient(url, admin_token=token) as client:
        try:
            return handler(client, server.model, namespace)
        except RequestFailed as exc:
            raise CheckFailed(f"{url}: {exc.status} {exc.message}") from None
        except OSError as exc:
            raise CheckFailed(
                f"{url}: cannot reach the server ({exc}); is it running there (--url)?"
            ) from None


def _start(client: PolicyClient, model: str, namespace: argparse.Namespace) -> int:
    args = from_namespace(StartArgs, namespace)
    started = client.start_canary(
        model, args.version, args.share, action="auto" if args.auto else "report",
        mode="shadow" if args.shadow else "episodes", margin=args.margin, alpha=args.alpha,
        min_episodes=args.min_episodes, planned_episodes=args.planned_episodes,
    )  # fmt: skip
    plan = started["canary"]
    workers = started["workers"]
    everywhere = "every worker" if started["all_workers"] else "not yet every worker"
    what = "runs in shadow on" if plan["mode"] == "shadow" else "serves"
    unit = "live batches" if plan["mode"] == "shadow" else "episodes"
    print(
        f"model {model}: canary version {plan['version']} {what} {plan['share']:g} of "
        f"{unit} ({plan['action']}); {len(workers)} worker(s) follow it ({everywhere})"
    )
    return 0


def _status(client: PolicyClient, model: str, namespace: argparse.Namespace) -> int:
    status = client.canary(model)
    print(status_text(status))
    return 1 if status["verdict"] == "rollback" else 0


def _promote(client: PolicyClient, model: str, namespace: argparse.Namespace) -> int:
    report = client.promote_canary(model)
    print(f"model {model}: canary version {report['version']} promoted: it is live now")
    return 0


def _rollback(client: PolicyClient, model: str, namespace: argparse.Namespace) -> int:
    report = client.rollback_canary(model)
    print(
        f"model {model}: canary version {report['version']} rolled back; version "
        f"{report['active_version']} serves every episode"
    )
    return 0


def status_text(status: dict[str, Any]) -> str:
    """Both versions' returns, the interval and the verdict, as a few lines of text."""
    plan = status["canary"]
    if plan["mode"] == "shadow":
        return _shadow_text(status)
    lines = [
        f"model {status['model']}: canary version {plan['version']} on {plan['share']:g} of "
        f"episodes ({plan['action']}), counted on {status['workers']} worker(s)",
        f"{'':8}{'version':>8}{'episodes':>10}{'mean return':>14}{'stddev':>10}",
    ]
    for side in status["versions"]:
        lines.append(
            f"{side['arm']:8}{side['version']:>8}{side['episodes']:>10}"
            f"{_number(side['mean_return']):>14}{_number(side['return_stddev']):>10}"
        )
    lower, upper = status["interval"]
    lines.append(
        f"canary - live: {_number(status['difference'])} in [{_number(lower)}, {_number(upper)}]"
    )
    lines.append(f"verdict: {status['verdict']} ({status['reason']})")
    return "\n".join(lines)


def _shadow_text(status: dict[str, Any]) -> str:
    plan, shadow = status["canary"], status["shadow"]
    live = status["versions"][0]["version"]
    agreement = "-" if shadow["agreement"] is None else f"{shadow['agreement']:.1%}"
    return "\n".join([
        f"model {status['model']}: canary version {plan['version']} in shadow on "
        f"{plan['share']:g} of version {live}'s batches, counted on {status['workers']} "
        "worker(s)",
        f"rows compared: {shadow['rows']}",
        f"actions agreeing with version {live}: {agreement}",
        f"mean KL(live || canary): {_number(shadow['mean_kl'])}",
        f"verdict: none ({status['reason']})",
    ])  # fmt: skip


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


_Handler = Callable[["PolicyClient", str, argparse.Namespace], int]
ACTIONS: dict[str, tuple[str, tuple[type, ...], _Handler]] = {
    "start": ("serve a version on a share of episodes beside the live one", (StartArgs,), _start),
    "status": ("both versions' returns, the interval and the gate's verdict", (), _status),
    "promote": ("make the canary's version the live one", (), _promote),
    "rollback": ("end the canary: the live version serves every episode", (), _rollback),
}
