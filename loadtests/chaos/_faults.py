"""The faults, injected one at a time while the load runs, each checked and logged.

Each fault returns a :class:`FaultLog`: when it started and ended (``time.monotonic()``),
whether the server behaved as it must (OK), did not (FAILED, saying how), or the fault could
not run here (SKIPPED, saying what it needs). The load's own requests are judged by the
accounting, not here.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from loadtests.chaos._gunicorn import Gunicorn, client_ports
from loadtests.chaos._plan import ControlFiles
from loadtests.chaos._records import RequestRecord
from loadtests.chaos._server_api import ServerApi
from loadtests.chaos._slow_clients import SlowClients

CORRUPT = b"rlserve chaos suite: these bytes are not an ONNX model\n"
MODEL_FILE = "model.onnx"


class FaultKind(StrEnum):
    CORRUPT_PUSH = "corrupt-push"
    PUSH = "push"
    ROLLBACK = "rollback"
    HOLD = "hold"
    BURST = "burst"
    SLOW_CLIENTS = "slow-clients"
    REPOSITORY_AWAY = "repository-away"
    DRAIN = "drain"
    KILL = "kill"
    RESTART_WHILE_AWAY = "restart-while-away"  # not in the default run (DEFAULT_FAULTS)


# A default run: every fault but the compound one, in this order.
DEFAULT_FAULTS = tuple(k for k in FaultKind if k is not FaultKind.RESTART_WHILE_AWAY)


DESCRIPTIONS = {
    FaultKind.CORRUPT_PUSH: "push bytes that are not ONNX (with their right sha256) as the next "
    "version: must be refused with a 4xx and change nothing",
    FaultKind.PUSH: "push a good new version (the active version's file, under the next "
    "number): must be activated, in every worker within --propagation-s",
    FaultKind.ROLLBACK: "roll back to the previous version: in every worker within "
    "--propagation-s (needs the push)",
    FaultKind.HOLD: "hold the model (max_hold_s = --hold-s + 1) for --hold-s, then resume: "
    "the hold must show (held, /ready 503) and requests must wait, not fail",
    FaultKind.BURST: "--burst-factor x --users extra users send back to back for --burst-s",
    FaultKind.SLOW_CLIENTS: "--slow-clients connections for --slow-s: half idle, half "
    "trickling a predict body over 0.2x to 2x the deadline",
    FaultKind.REPOSITORY_AWAY: "rename the model repository away for --repository-away-s, "
    "then back (root reads through chmod, so it is moved instead)",
    FaultKind.DRAIN: "SIGTERM one gunicorn worker: it drains; gunicorn starts another",
    FaultKind.KILL: "SIGKILL one gunicorn worker (stopped first with SIGSTOP to note its "
    "connections); gunicorn starts another",
    FaultKind.RESTART_WHILE_AWAY: "(not run by default) rename the repository away, SIGTERM "
    "one worker so that its replacement starts without it, put the repository back: every "
    "worker must serve within --propagation-s after that",
}


class FaultResult(StrEnum):
    OK = "ok"
    FAILED = "FAILED"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class FaultLog:
    kind: FaultKind
    started: float
    ended: float
    result: FaultResult
    detail: str


@dataclass(frozen=True)
class KillEvent:
    """A worker killed with SIGKILL: the connections it held when it was stopped."""

    pid: int
    stopped_at: float  # SIGSTOP: from here on it answers nothing
    killed_at: float
    ports: frozenset[int]  # the client ports of its connections


@dataclass(frozen=True)
class FaultSettings:
    burst_s: float
    hold_s: float
    slow_clients: int
    slow_s: float
    repository_away_s: float
    propagation_s: float
    restart_s: float


@dataclass
class Target:
    """What the faults act on."""

    api: ServerApi
    url: str
    model: str
    predict_path: str
    predict_body: bytes
    predict_headers: dict[str, str]
    deadline_ms: float
    control: ControlFiles
    burst_users: int
    admin: bool  # an admin token was given
    repository: Path | None
    gunicorn: Gunicorn | None


class Failed(Exception):
    """The server did not behave as the fault requires (the message says how)."""


class Skipped(Exception):
    """The fault cannot run here (the message says what it needs)."""


@dataclass
class FaultInjector:
    target: Target
    settings: FaultSettings
    kills: list[KillEvent] = field(default_factory=list)
    slow_records: list[RequestRecord] = field(default_factory=list)
    pushed: int | None = None  # the version the push fault activated
    workers: int = 0  # gunicorn's worker count at the start

    def __post_init__(self) -> None:
        if self.target.gunicorn is not None:
            self.workers = len(self.target.gunicorn.workers())

    def inject(self, kind: FaultKind) -> FaultLog:
        faults: dict[FaultKind, Callable[[], str]] = {
            FaultKind.CORRUPT_PUSH: self.corrupt_push,
            FaultKind.PUSH: self.push,
            FaultKind.ROLLBACK: self.rollback,
            FaultKind.HOLD: self.hold,
            FaultKind.BURST: self.burst,
            FaultKind.SLOW_CLIENTS: self.slow_clients,
            FaultKind.REPOSITORY_AWAY: self.repository_away,
            FaultKind.DRAIN: self.drain,
            FaultKind.KILL: self.kill,
            FaultKind.RESTART_WHILE_AWAY: self.restart_while_away,
        }
        started = time.monotonic()
        try:
            detail, result = faults[kind](), FaultResult.OK
        except Failed as exc:
            detail, result = str(exc), FaultResult.FAILED
        except Skipped as exc:
            detail, result = str(exc), FaultResult.SKIPPED
        except (LookupError, OSError) as exc:  # the server stopped answering, a file vanished
            detail, result = f"{type(exc).__name__}: {exc}", FaultResult.FAILED
        return FaultLog(kind, started, time.monotonic(), result, detail)

    # ------------------------------------------------------------------ versions

    def corrupt_push(self) -> str:
        self._need_admin()
        api, model = self.target.api, self.target.model
        before, served_before = api.model(model), api.served_versions(model)
        version = self._next_version()
        data = CORRUPT + os.urandom(64)
        answer = api.push(model, version, data)
        told = f"PUT v{version} ({len(data)} bytes, not ONNX, right sha256) -> {answer.short()}"
        problems = []
        if not 400 <= answer.status < 500:
            problems.append("expected a 4xx refusal")
        after, served_after = api.model(model), api.served_versions(model)
        if after.active_version != before.active_version:
            problems.append(f"active version {before.active_version} -> {after.active_version}")
        changed = {
            pid: (v, served_after[pid])
            for pid, v in served_before.items()
            if pid in served_after and served_after[pid] != v
        }
        if changed:
            problems.append(f"workers changed version (pid: before, after): {changed}")
        left = self._version_dir(version)
        if left is not None and left.exists():
            problems.append(f"{left} was left in the repository")
        if problems:
            raise Failed(f"{told}; " + "; ".join(problems))
        return f"{told}; active v{after.active_version} unchanged in every worker"

    def push(self) -> str:
        self._need_admin()
        data = self._good_model()
        api, model = self.target.api, self.target.model
        version = self._next_version()
        answer = api.push(model, version, data)
        told = f"PUT v{version} ({len(data)} bytes) -> {answer.short(120)}"
        if not answer.ok or answer.json().get("active_version") != version:
            raise Failed(f"{told}; expected it activated")
        self.pushed = version
        return f"{told}; {self._everywhere(version)}"

    def rollback(self) -> str:
        self._need_admin()
        if self.pushed is None:
            raise Skipped("needs the push fault first (a previous version to roll back to)")
        api, model = self.target.api, self.target.model
        answer = api.rollback(model)
        told = f"POST rollback (from v{self.pushed}) -> {answer.short(120)}"
        target = answer.json().get("active_version")
        if not answer.ok or not isinstance(target, int) or target == self.pushed:
            raise Failed(f"{told}; expected the previous version activated")
        return f"{told}; {self._everywhere(target)}"

    def hold(self) -> str:
        self._need_admin()
        api, model = self.target.api, self.target.model
        max_hold_s = self.settings.hold_s + 1
        held = api.hold(model, max_hold_s)
        shown, ready = api.model(model), api.ready()
        time.sleep(self.settings.hold_s)
        resumed = api.resume(model)
        told = (
            f"POST hold?max_hold_s={max_hold_s:g} -> {held.status}; held={shown.held}, "
            f"/ready {ready.short(100)}; POST resume after {self.settings.hold_s:g}s -> "
            f"{resumed.status}"
        )
        problems = []
        if not (held.ok and resumed.ok):
            problems.append(f"hold {held.short()}, resume {resumed.short()}")
        if not shown.held:
            problems.append("GET /v1/models shows held=false during the hold")
        if ready.status != 503:
            problems.append("/ready did not answer 503 during the hold")
        if problems:
            raise Failed(f"{told}; " + "; ".join(problems))
        return told

    # ------------------------------------------------------------------ traffic

    def burst(self) -> str:
        if self.target.burst_users == 0:
            raise Skipped("--burst-factor 0: no burst users")
        self.target.control.burst.touch()
        try:
            time.sleep(self.settings.burst_s)
        finally:
            self.target.control.burst.unlink(missing_ok=True)
        users, seconds = self.target.burst_users, self.settings.burst_s
        return f"{users} burst users sent back to back for {seconds:g}s"

    def slow_clients(self) -> str:
        count = self.settings.slow_clients
        if count == 0:
            raise Skipped("--slow-clients 0")
        t = self.target
        clients = SlowClients(
            t.url, t.predict_path, t.predict_body, t.deadline_ms, idle=count // 2,
            trickling=count - count // 2, hold_s=self.settings.slow_s, headers=t.predict_headers,
        )  # fmt: skip
        clients.start()
        clients.join(self.settings.slow_s + 2 * t.deadline_ms / 1000 + 15)
        self.slow_records.extend(clients.records)
        closed = [o.closed_by_server_after_s for o in clients.idle_outcomes]
        closed_by_server = [c for c in closed if c is not None]
        statuses = Counter(r.status or f"no answer ({r.error})" for r in clients.records)
        answered = ", ".join(f"{status} x{n}" for status, n in sorted(statuses.items(), key=str))
        idle = (
            f"{clients.idle} idle connections for {self.settings.slow_s:g}s "
            f"({len(closed_by_server)} closed by the server"
            + (f", after {min(closed_by_server):.1f}s at the earliest" if closed_by_server else "")
            + ")"
        )
        detail = f"{idle}; {clients.trickling} bodies trickled: {answered or 'none ended'}"
        if len(clients.records) + len(clients.idle_outcomes) < count:
            raise Failed(f"{detail}; some slow clients had not ended")
        return detail

    # ------------------------------------------------------------------ the repository

    def repository_away(self) -> str:
        repository = self._need_repository()
        away = repository.with_name(repository.name + ".chaos-away")
        api = self.target.api
        os.rename(repository, away)
        try:
            time.sleep(self.settings.repository_away_s / 2)
            ready = api.ready()
            time.sleep(self.settings.repository_away_s / 2)
        finally:
            recreated = restore_repository(repository, away)
        told = (
            f"{repository} renamed to {away.name} for {self.settings.repository_away_s:g}s "
            f"and back; /ready meanwhile: {ready.short(100)}"
        )
        if recreated is not None:
            raise Failed(
                f"{told}; the server re-created {repository} while it was away "
                f"(moved to {recreated}: {_listing(recreated)})"
            )
        return told

    # ------------------------------------------------------------------ workers

    def drain(self) -> str:
        gunicorn = self._need_gunicorn()
        victim = gunicorn.workers()[0]
        os.kill(victim, signal.SIGTERM)
        return f"SIGTERM worker {victim}; {self._replaced(gunicorn, victim)}"

    def kill(self) -> str:
        gunicorn = self._need_gunicorn()
        victim = gunicorn.workers()[0]
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            ports = client_ports(victim)
        finally:
            os.kill(victim, signal.SIGKILL)
        self.kills.append(KillEvent(victim, stopped_at, time.monotonic(), ports))
        told = f"SIGKILL worker {victim} (it held {len(ports)} client connections)"
        return f"{told}; {self._replaced(gunicorn, victim)}"

    def restart_while_away(self) -> str:
        repository, gunicorn = self._need_repository(), self._need_gunicorn()
        expected = self.target.api.model(self.target.model).active_version
        away = repository.with_name(repository.name + ".chaos-away")
        os.rename(repository, away)
        try:
            before = gunicorn.workers()
            victim = before[0]
            os.kill(victim, signal.SIGTERM)
            started = self._started_instead(gunicorn, set(before))
            time.sleep(self.settings.repository_away_s)
        finally:
            recreated = restore_repository(repository, away)
        told = (
            f"{repository} renamed away; SIGTERM worker {victim}: gunicorn started {started} "
            f"without the repository; back after {self.settings.repository_away_s:g}s more"
        )
        if recreated is not None:
            told += (
                f"; the server re-created the repository's path meanwhile ({_listing(recreated)})"
            )
        try:
            served = self._replaced(gunicorn, victim, self.settings.propagation_s, expected)
        except Failed as exc:
            raise Failed(f"{told}; {exc}") from None
        if recreated is not None:
            raise Failed(f"{told}; {served}")
        return f"{told}; {served}"

    def _started_instead(self, gunicorn: Gunicorn, before: set[int]) -> int:
        """The worker gunicorn started in place of one of ``before`` (it may not serve yet)."""
        deadline = time.monotonic() + self.settings.restart_s
        while time.monotonic() < deadline:
            new = set(gunicorn.workers()) - before
            if new:
                return new.pop()
            time.sleep(0.05)
        raise Failed(f"gunicorn started no new worker in {self.settings.restart_s:g}s")

    def _replaced(
        self, gunicorn: Gunicorn, gone: int, within_s: float | None = None,
        expected: int | None = None,
    ) -> str:  # fmt: skip
        """Waits until gunicorn has replaced ``gone`` and every worker serves ``expected``
        (default: the active version), ``within_s`` at most (default: --restart-s)."""
        self.target.api.reconnect()  # an update must not go out on the gone worker's connection
        within_s = self.settings.restart_s if within_s is None else within_s
        started = time.monotonic()
        deadline = started + within_s
        if expected is None:
            expected = self.target.api.model(self.target.model).active_version
        while time.monotonic() < deadline:
            workers = set(gunicorn.workers())
            served = self.target.api.served_versions(self.target.model)
            if (
                gone not in workers
                and len(workers) == self.workers
                and all(served.get(pid) == expected for pid in workers)
            ):
                new = ", ".join(str(pid) for pid in sorted(workers - {gone}))
                waited = time.monotonic() - started
                return f"replaced (now {new}); every worker serves v{expected} after {waited:.2f}s"
            time.sleep(0.1)
        workers = set(gunicorn.workers())
        served = self.target.api.served_versions(self.target.model)
        raise Failed(
            f"after {within_s:g}s: workers {sorted(workers)}, versions served "
            f"by pid {served} (expected {self.workers} workers on v{expected})"
        )

    # ------------------------------------------------------------------ helpers

    def _everywhere(self, version: int) -> str:
        """Waits until every worker serves ``version`` (``--propagation-s`` at most)."""
        started = time.monotonic()
        deadline = started + self.settings.propagation_s
        served: dict[int, int] = {}
        while True:
            served = self.target.api.served_versions(self.target.model)
            live = self._live(served)
            if live and all(v == version for v in live.values()):
                return f"every worker serves v{version} after {time.monotonic() - started:.2f}s"
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        raise Failed(
            f"not every worker serves v{version} after {self.settings.propagation_s:g}s: "
            f"version by worker pid {self._live(served)}"
        )

    def _live(self, served: dict[int, int]) -> dict[int, int]:
        """The versions of the workers that exist (all, when the workers are not known)."""
        if self.target.gunicorn is None:
            return served
        workers = self.target.gunicorn.workers()
        return {pid: served.get(pid, -1) for pid in workers}

    def _next_version(self) -> int:
        view = self.target.api.model(self.target.model)
        known = {*view.versions, *self.target.api.served_versions(self.target.model).values()}
        if view.active_version is not None:
            known.add(view.active_version)
        if self.target.repository is not None:
            model_dir = self.target.repository / self.target.model
            known |= {int(p.name) for p in model_dir.iterdir() if p.name.isdigit()}
        return max(known, default=0) + 1

    def _good_model(self) -> bytes:
        repository = self._need_repository()
        active = self.target.api.model(self.target.model).active_version
        model_dir = repository / self.target.model
        candidates = [model_dir / str(active) / MODEL_FILE, *model_dir.glob(f"*/{MODEL_FILE}")]
        for path in candidates:
            if path.is_file():
                return path.read_bytes()
        raise Skipped(f"no {MODEL_FILE} of {self.target.model} in {repository}")

    def _version_dir(self, version: int) -> Path | None:
        if self.target.repository is None:
            return None
        return self.target.repository / self.target.model / str(version)

    def _need_admin(self) -> None:
        if not self.target.admin:
            raise Skipped("needs --admin-token (or RLSERVE_ADMIN_TOKEN)")

    def _need_repository(self) -> Path:
        if self.target.repository is None:
            raise Skipped("needs --model-repository (the server's repository, on this machine)")
        return self.target.repository

    def _need_gunicorn(self) -> Gunicorn:
        gunicorn = self.target.gunicorn
        if gunicorn is None or not gunicorn.workers():
            raise Skipped("needs a gunicorn server on this machine (--gunicorn-pid)")
        return gunicorn


def restore_repository(repository: Path, away: Path) -> Path | None:
    """Puts the repository back; what took its place meanwhile is moved aside and returned."""
    recreated = None
    if repository.exists():
        recreated = repository.with_name(f"{repository.name}.chaos-recreated-{time.time():.0f}")
        os.rename(repository, recreated)
    os.rename(away, repository)
    return recreated


def _listing(root: Path, at_most: int = 8) -> str:
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    more = f", ... ({len(found)} in all)" if len(found) > at_most else ""
    return ", ".join(found[:at_most]) + more if found else "empty"
