"""One chaos run: locust load on a running server, the faults in turn, then the account.

The load runs in a locust subprocess (``_users.py``), steered through flag files
(``_plan``). The faults run here, one after the other, spread over the run: the first
after ``warmup_s``, the rest evenly until ``cooldown_s`` before the end (a fault that takes
longer pushes the next ones back, and the end with them). Then locust is told to stop, its
records are read, and every request is put in exactly one row (``_accounting``).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadtests._traffic import traffic_for
from loadtests.chaos._accounting import account
from loadtests.chaos._faults import FaultInjector, FaultKind, FaultLog, FaultSettings, Target
from loadtests.chaos._gunicorn import REPO, Gunicorn
from loadtests.chaos._plan import PLAN_ENV, LoadPlan
from loadtests.chaos._records import RequestRecord, read_records
from loadtests.chaos._report import ChaosReport, LoadShape
from loadtests.chaos._server_api import ServerApi
from loadtests.chaos._verdict import gates

USERS_FILE = Path(__file__).with_name("_users.py")
LOCUST_START_S = 120.0


class LoadFailed(Exception):
    """locust did not start, or did not hand back its records."""


@dataclass(frozen=True)
class RunOptions:
    url: str
    admin_token: str | None
    model: str  # "": the server's first model
    repository: Path | None
    gunicorn: Gunicorn | None
    duration_s: float
    warmup_s: float
    cooldown_s: float
    users: int
    think_time_ms: float
    batch_rows: int
    deadline_ms: float | None
    deterministic: bool
    burst_factor: float
    faults: tuple[FaultKind, ...]
    fault_settings: FaultSettings
    p99_ms: float | None  # None: the requests' deadline
    work_dir: Path


def run_chaos(options: RunOptions) -> ChaosReport:
    api = ServerApi(options.url, options.admin_token)
    try:
        return _run(options, api)
    finally:
        api.close()


def _run(options: RunOptions, api: ServerApi) -> ChaosReport:
    model = options.model or api.first_model()
    view = api.model(model)
    deadline_ms = view.default_deadline_ms
    if options.deadline_ms is not None:
        deadline_ms = min(deadline_ms, options.deadline_ms)
    timeout_s = max(10.0, 3 * deadline_ms / 1000)
    actors = math.ceil(options.users / 2)
    plan = LoadPlan(
        host=options.url,
        model=model,
        deterministic=options.deterministic,
        batch_rows=options.batch_rows,
        think_time_s=options.think_time_ms / 1000,
        deadline_ms=options.deadline_ms,
        timeout_s=timeout_s,
        actor_users=actors,
        vector_users=options.users - actors,
        burst_users=round(options.burst_factor * options.users),
        control_dir=str(options.work_dir / "control"),
    )
    plan.control.root.mkdir(parents=True, exist_ok=True)
    single = traffic_for(options.url, model, options.deterministic, None)
    headers = {} if options.deadline_ms is None else {"X-Request-Timeout-Ms": f"{deadline_ms:g}"}
    injector = FaultInjector(
        Target(
            api=api,
            url=options.url,
            model=model,
            predict_path=single.path,
            predict_body=single.bodies[0],
            predict_headers=headers,
            deadline_ms=deadline_ms,
            control=plan.control,
            burst_users=plan.burst_users,
            admin=bool(options.admin_token),
            repository=options.repository,
            gunicorn=options.gunicorn,
        ),
        options.fault_settings,
    )
    workers = len(options.gunicorn.workers()) if options.gunicorn else None
    locust = _start_locust(plan, options.work_dir)
    try:
        load_started = _wait_running(locust, plan, options.work_dir)
        faults = _inject(injector, options, load_started)
        load_ended = time.monotonic()
        records = _stop_locust(locust, plan, options.work_dir)
    finally:
        plan.control.burst.unlink(missing_ok=True)
        _end(locust)
    records += injector.slow_records
    load_started = min([load_started, *(r.started for r in records)])
    tally = account(records, injector.kills, faults, load_started, load_ended, timeout_s)
    p99_ms = options.p99_ms if options.p99_ms is not None else deadline_ms
    return ChaosReport(
        url=options.url,
        model=model,
        workers=workers,
        load=LoadShape(
            plan.actor_users,
            plan.vector_users,
            plan.batch_rows,
            options.think_time_ms,
            plan.burst_users,
            deadline_ms,
            p99_ms,
        ),
        load_s=load_ended - load_started,
        load_started=load_started,
        faults=faults,
        kills=injector.kills,
        account=tally,
        gates=gates(tally, faults, p99_ms),
        work_dir=str(options.work_dir),
    )


def _inject(injector: FaultInjector, options: RunOptions, load_started: float) -> list[FaultLog]:
    window = max(0.0, options.duration_s - options.warmup_s - options.cooldown_s)
    spacing = window / max(len(options.faults), 1)
    logs = []
    for i, kind in enumerate(options.faults):
        _sleep_until(load_started + options.warmup_s + i * spacing)
        logs.append(injector.inject(kind))
        print(f"chaos: {_line(logs[-1], load_started)}", file=sys.stderr, flush=True)
    last_end = logs[-1].ended if logs else load_started
    _sleep_until(max(load_started + options.duration_s, last_end + options.cooldown_s))
    return logs


def _line(log: FaultLog, load_started: float) -> str:
    return f"t={log.started - load_started:.2f}s {log.kind.value} {log.result.value}: {log.detail}"


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


# ---------------------------------------------------------------------- locust


def _start_locust(plan: LoadPlan, work_dir: Path) -> subprocess.Popen[bytes]:
    plan_file = work_dir / "plan.json"
    plan.save(plan_file)
    counts = {
        "ActorUser": plan.actor_users,
        "VectorEnvUser": plan.vector_users,
        "BurstUser": plan.burst_users,
    }
    users = sum(counts.values())
    ceiling_s = 3600  # the run stops locust long before; this only bounds an orphan
    command = [
        sys.executable, "-m", "locust", "-f", str(USERS_FILE), "--headless",
        "--host", plan.host, "-u", str(users), "-r", str(users * 10), "-t", f"{ceiling_s}s",
        "--only-summary", "--stop-timeout", "5", "--exit-code-on-error", "0",
        *(name for name, count in counts.items() if count > 0),
    ]  # fmt: skip
    env = {
        **os.environ,
        PLAN_ENV: str(plan_file),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    with open(work_dir / "locust.log", "wb") as log:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_running(locust: subprocess.Popen[bytes], plan: LoadPlan, work_dir: Path) -> float:
    deadline = time.monotonic() + LOCUST_START_S
    while not plan.control.running.exists():
        if locust.poll() is not None or time.monotonic() > deadline:
            raise LoadFailed(f"locust did not start its load:\n{_tail(work_dir / 'locust.log')}")
        time.sleep(0.05)
    return time.monotonic()


def _stop_locust(
    locust: subprocess.Popen[bytes], plan: LoadPlan, work_dir: Path
) -> list[RequestRecord]:
    plan.control.stop.touch()
    deadline = time.monotonic() + plan.timeout_s + 30
    while not plan.control.records.exists():
        if locust.poll() is not None or time.monotonic() > deadline:
            raise LoadFailed(f"locust did not write its records:\n{_tail(work_dir / 'locust.log')}")
        time.sleep(0.05)
    return read_records(plan.control.records)


def _end(locust: subprocess.Popen[bytes]) -> None:
    if locust.poll() is None:
        locust.send_signal(signal.SIGTERM)
    try:
        locust.wait(30)
    except subprocess.TimeoutExpired:
        locust.kill()
        locust.wait()


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"
