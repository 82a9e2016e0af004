"""``python -m loadtests.chaos``: the command line of the chaos suite."""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from loadtests.chaos._faults import DEFAULT_FAULTS, DESCRIPTIONS, FaultKind, FaultSettings
from loadtests.chaos._gunicorn import Gunicorn, ServerNotFound, StartedServer, start_gunicorn
from loadtests.chaos._run import LoadFailed, RunOptions, run_chaos

DESCRIPTION = """\
Chaos suite for rlserve: locust load on a gunicorn server while faults are injected one
after the other, then an account of every request the load sent. Either attach to a
running server (--host, with --admin-token, --model-repository and a local gunicorn for
every fault to run) or let the suite start one (--start-server --model-repository PATH:
gunicorn with --workers workers on a copy of the repository).

Every request ends in exactly one row: answered (2xx); refused (429, 503, 504: allowed);
errors (any other status: must be 0); in the killed worker (no answer, on a connection the
SIGKILLed worker held: counted, not gated, since nobody can answer those); lost (no answer
otherwise: must be 0). The p99 of answered requests must stay within the deadline.
Exit code 0 when every gate passes, 1 when one fails, 2 for bad options or a server or
load generator that could not be started. See docs/chaos.md.
"""

# The started server's settings besides the port, token, workers and repository: a drain
# that tells keep-alive clients (as the Kubernetes config does, with 5 s), and a queue that
# the burst (80 users x 8 rows by default) overflows, so that the 429 path is exercised.
START_ENV = {"RLSERVE_DRAIN_DELAY_S": "0.5", "RLSERVE_MAX_QUEUE_ROWS": "256"}

FAULTS_HELP = "\n".join(f"  {kind.value:<16} {DESCRIPTIONS[kind]}" for kind in FaultKind)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.chaos",
        description=DESCRIPTION,
        epilog=f"faults, in the order they run by default:\n{FAULTS_HELP}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = p.add_argument_group("the server")
    target.add_argument(
        "--host", default="", metavar="URL",
        help="URL of a running rlserve server (e.g. http://127.0.0.1:8000); not with "
        "--start-server",
    )  # fmt: skip
    target.add_argument(
        "--admin-token", default=os.environ.get("RLSERVE_ADMIN_TOKEN"), metavar="TOKEN",
        help="the server's admin token, for the push, rollback and hold faults (default: "
        "$RLSERVE_ADMIN_TOKEN); without it those faults are skipped",
    )  # fmt: skip
    target.add_argument(
        "--model", default="", metavar="NAME",
        help="the model to load and to update; default: the server's first model",
    )  # fmt: skip
    target.add_argument(
        "--model-repository", type=Path, metavar="PATH",
        help="the server's model repository on this machine: the push fault pushes its "
        "active version's file, the repository-away fault renames it. With --start-server: "
        "the repository to copy and serve",
    )  # fmt: skip
    target.add_argument(
        "--gunicorn-pid", type=int, metavar="PID",
        help="pid of the gunicorn master, for the kill and drain faults; default: the "
        "gunicorn listening on --host's port, when that is on this machine",
    )  # fmt: skip
    start = p.add_argument_group("starting the server (--start-server)")
    start.add_argument(
        "--start-server", action="store_true",
        help="start gunicorn (rlserve's serve/process/gunicorn_conf.py) on a copy of "
        "--model-repository, with a fresh admin token, RLSERVE_DRAIN_DELAY_S=0.5 and "
        "RLSERVE_MAX_QUEUE_ROWS=256 (so that the burst overflows the queue), and stop it "
        "at the end",
    )  # fmt: skip
    start.add_argument(
        "--workers", type=int, default=2, help="gunicorn workers of the started server (2)"
    )
    start.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE",
        help="a setting for the started server, e.g. RLSERVE_MAX_BATCH_SIZE=64 (repeatable; "
        "overrides the defaults above)",
    )  # fmt: skip
    load = p.add_argument_group("the load")
    load.add_argument(
        "--duration", type=float, default=60.0,
        help="seconds of load; the faults are spread over it (60). A fault that takes "
        "longer than its share moves the later ones, and the end, back",
    )  # fmt: skip
    load.add_argument(
        "--warmup", type=float, default=3.0, help="seconds of load before the first fault (3)"
    )
    load.add_argument(
        "--cooldown", type=float, default=3.0,
        help="seconds of load after the last fault ends, to show the server recovered (3)",
    )  # fmt: skip
    load.add_argument(
        "--users", type=int, default=8,
        help="steady locust users (8): half actors (one observation a request), half "
        "vectorised actors (--batch-rows observations a request)",
    )  # fmt: skip
    load.add_argument(
        "--think-time-ms", type=float, default=5.0,
        help="pause of each steady user after each answer (5 ms)",
    )  # fmt: skip
    load.add_argument(
        "--batch-rows", type=int, default=8,
        help="observations per request of the vectorised and burst users (8)",
    )  # fmt: skip
    load.add_argument(
        "--deadline-ms", type=float,
        help="send X-Request-Timeout-Ms with every request (default: none, so the server's "
        "default deadline applies, read from GET /v1/models/{model})",
    )  # fmt: skip
    load.add_argument(
        "--stochastic", dest="deterministic", action="store_false",
        help="ask for sampled actions instead of deterministic ones",
    )  # fmt: skip
    faults = p.add_argument_group("the faults")
    faults.add_argument(
        "--faults", metavar="LIST", default=",".join(k.value for k in DEFAULT_FAULTS),
        help="comma-separated faults to inject, in this order (default: all but "
        "restart-while-away, in the order listed below)",
    )  # fmt: skip
    faults.add_argument(
        "--burst-factor", type=float, default=10.0,
        help="the burst adds this many times --users extra users, with no think time (10)",
    )  # fmt: skip
    faults.add_argument("--burst-s", type=float, default=3.0, help="seconds the burst lasts (3)")
    faults.add_argument(
        "--hold-s", type=float, default=1.0,
        help="seconds between hold and resume (1); the hold asks max_hold_s = this + 1",
    )  # fmt: skip
    faults.add_argument(
        "--slow-clients", type=int, default=8,
        help="slow client connections (8): half idle, half trickling a predict body",
    )  # fmt: skip
    faults.add_argument(
        "--slow-s", type=float, default=3.0, help="seconds the idle slow clients stay (3)"
    )
    faults.add_argument(
        "--repository-away-s", type=float, default=3.0,
        help="seconds the repository stays renamed away (3)",
    )  # fmt: skip
    faults.add_argument(
        "--propagation-s", type=float, default=10.0,
        help="a push or rollback must reach every worker within this (10 s)",
    )  # fmt: skip
    faults.add_argument(
        "--restart-s", type=float, default=60.0,
        help="a killed or drained worker must be replaced, serving, within this (60 s)",
    )  # fmt: skip
    gate = p.add_argument_group("gates and output")
    gate.add_argument(
        "--p99-ms", type=float,
        help="gate on the p99 latency of answered requests (default: the request deadline)",
    )  # fmt: skip
    gate.add_argument(
        "--json", type=Path, metavar="FILE", help="also write the report as JSON here"
    )
    gate.add_argument(
        "--work-dir", type=Path, metavar="DIR",
        help="folder for the locust log, the request records and the started server's log "
        "and repository copy (default: a temporary folder, removed after a passing run)",
    )  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    problem = _problem(args)
    if problem:
        p.error(problem)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="rlserve-chaos-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    server: StartedServer | None = None
    try:
        if args.start_server:
            server = _start(args, work_dir)
            print(f"chaos: started gunicorn at {server.url} (log: {server.log})", file=sys.stderr)
        report = run_chaos(_options(args, work_dir, server))
    except (ServerNotFound, LoadFailed, LookupError) as exc:
        print(f"chaos: error: {exc}", file=sys.stderr)
        print(f"chaos: logs kept in {work_dir}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.stop()
    print(report.text(), flush=True)
    if args.json:
        report.write_json(args.json)
    if report.passed and args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    elif not report.passed:
        print(f"chaos: logs and records kept in {work_dir}", file=sys.stderr)
    return 0 if report.passed else 1


def _problem(args: argparse.Namespace) -> str | None:
    if args.start_server == bool(args.host):
        return "give either --host URL (a running server) or --start-server, not both"
    if args.start_server and args.model_repository is None:
        return "--start-server needs --model-repository (the repository to copy and serve)"
    if args.model_repository is not None and not args.model_repository.is_dir():
        return f"--model-repository {args.model_repository}: not a directory"
    try:
        faults = _faults(args.faults)
    except ValueError as exc:
        return str(exc)
    if not faults:
        return "--faults: name at least one fault"
    if args.users < 1 or args.batch_rows < 1 or args.workers < 1:
        return "--users, --batch-rows and --workers must be at least 1"
    if min(args.duration, args.warmup, args.cooldown, args.burst_factor, args.think_time_ms) < 0:
        return "durations, --burst-factor and --think-time-ms cannot be negative"
    for item in args.server_env:
        if "=" not in item:
            return f"--server-env {item!r}: expected NAME=VALUE"
    return None


def _faults(text: str) -> tuple[FaultKind, ...]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = [k.value for k in FaultKind]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"--faults: unknown {unknown}; known: {', '.join(known)}")
    return tuple(FaultKind(name) for name in names)


def _start(args: argparse.Namespace, work_dir: Path) -> StartedServer:
    copy = work_dir / "repository"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(args.model_repository, copy)
    env = {**START_ENV, **dict(item.split("=", 1) for item in args.server_env)}
    return start_gunicorn(copy, work_dir, args.workers, env)


def _options(args: argparse.Namespace, work_dir: Path, server: StartedServer | None) -> RunOptions:
    gunicorn: Gunicorn | None
    if server is not None:
        url, token = server.url, server.admin_token
        repository, gunicorn = server.repository, server.gunicorn
    else:
        url, token = args.host.rstrip("/"), args.admin_token
        repository, gunicorn = args.model_repository, _gunicorn(args)
    return RunOptions(
        url=url,
        admin_token=token,
        model=args.model,
        repository=repository,
        gunicorn=gunicorn,
        duration_s=args.duration,
        warmup_s=args.warmup,
        cooldown_s=args.cooldown,
        users=args.users,
        think_time_ms=args.think_time_ms,
        batch_rows=args.batch_rows,
        deadline_ms=args.deadline_ms,
        deterministic=args.deterministic,
        burst_factor=args.burst_factor,
        faults=_faults(args.faults),
        fault_settings=FaultSettings(
            burst_s=args.burst_s,
            hold_s=args.hold_s,
            slow_clients=args.slow_clients,
            slow_s=args.slow_s,
            repository_away_s=args.repository_away_s,
            propagation_s=args.propagation_s,
            restart_s=args.restart_s,
        ),
        p99_ms=args.p99_ms,
        work_dir=work_dir,
    )


def _gunicorn(args: argparse.Namespace) -> Gunicorn | None:
    """The gunicorn master given, or found listening on --host's port on this machine."""
    if args.gunicorn_pid is not None:
        return Gunicorn(args.gunicorn_pid)
    parts = urlsplit(args.host)
    if not _local(parts.hostname or "") or parts.port is None:
        return None
    try:
        found = Gunicorn.listening_on(parts.port)
    except ServerNotFound as exc:
        print(f"chaos: the kill and drain faults will be skipped: {exc}", file=sys.stderr)
        return None
    print(f"chaos: gunicorn master {found.master}, workers {found.workers()}", file=sys.stderr)
    return found


def _local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
