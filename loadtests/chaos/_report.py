"""The chaos run's report: printed as text, written as JSON with ``--json``."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.chaos._accounting import Account, Latency, Problem
from loadtests.chaos._faults import FaultLog, KillEvent
from loadtests.chaos._records import Source
from loadtests.chaos._verdict import Gate

ROWS_SHOWN = 12


@dataclass(frozen=True)
class LoadShape:
    actor_users: int
    vector_users: int
    batch_rows: int
    think_time_ms: float
    burst_users: int
    deadline_ms: float  # the deadline the requests ran under
    p99_gate_ms: float


@dataclass(frozen=True)
class ChaosReport:
    url: str
    model: str
    workers: int | None
    load: LoadShape
    load_s: float
    load_started: float  # time.monotonic() when the load began: faults are relative to it
    faults: list[FaultLog]
    kills: list[KillEvent]
    account: Account
    gates: list[Gate]
    work_dir: str

    @property
    def passed(self) -> bool:
        return all(gate.passed for gate in self.gates)

    def to_json(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["faults"] = [
            {**dataclasses.asdict(f), "started_s": f.started - self.load_started,
             "ended_s": f.ended - self.load_started}
            for f in self.faults
        ]  # fmt: skip
        raw["kills"] = [
            {"pid": k.pid, "at_s": k.killed_at - self.load_started, "connections": len(k.ports)}
            for k in self.kills
        ]
        raw["passed"] = self.passed
        return _finite(raw)

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2))

    # ------------------------------------------------------------------ text

    def text(self) -> str:
        load, a = self.load, self.account
        workers = f", {self.workers} gunicorn workers" if self.workers else ""
        lines = [
            f"rlserve chaos run: {self.url}, model {self.model}{workers}",
            f"load: {load.actor_users} actors x1 and {load.vector_users} vectorised actors "
            f"x{load.batch_rows} (think {load.think_time_ms:g} ms), {load.burst_users} burst "
            f"users; deadline {load.deadline_ms:g} ms; {self.load_s:.1f} s",
            "",
            "faults (t: seconds since the load started)",
        ]
        for f in self.faults:
            span = f"t={f.started - self.load_started:6.2f}-{f.ended - self.load_started:6.2f}"
            lines.append(f"  {span}  {f.kind.value:<18} {f.result.value:<8} {f.detail}")
        lines += ["", *self._requests_table(a), ""]
        lines.append(
            f"latency of answered requests (steady and burst users): {_latency(a.latency)}"
            f"  (gate: p99 <= {load.p99_gate_ms:g} ms)"
        )
        for source, latency in a.latency_by_source.items():
            lines.append(f"  {source:<7} {_latency(latency)}")
        lines += ["", *self._phases_table(a), ""]
        lines += _problems("errors (a status other than 2xx/429/503/504)", a.errors)
        lines += _problems("lost (no answer, outside the killed worker)", a.lost)
        lines.append("")
        failed = [g for g in self.gates if not g.passed]
        for gate in failed:
            lines.append(f"GATE FAILED: {gate.name}: {gate.detail}")
        if not failed:
            summary = "; ".join(g.detail.split(";")[0] for g in self.gates)
            lines.append(f"GATES PASSED: {summary}")
        return "\n".join(lines)

    def _requests_table(self, a: Account) -> list[str]:
        columns = [s.value for s in Source if s.value in a.by_source]
        tallies = [a.by_source[c] for c in columns] + [a.total]
        statuses = sorted({s for t in tallies for s in t.refused} | {429, 503, 504})
        rows: list[tuple[str, list[int]]] = [("answered 2xx", [t.answered for t in tallies])]
        rows += [(f"refused {s}", [t.refused.get(s, 0) for t in tallies]) for s in statuses]
        rows += [
            ("errors (other status)", [t.error for t in tallies]),
            ("in the killed worker", [t.killed for t in tallies]),
            ("lost", [t.lost for t in tallies]),
            ("all requests", [t.total for t in tallies]),
        ]
        header = f"  {'requests':<22}" + "".join(f"{c:>9}" for c in [*columns, "all"])
        out = [header]
        for name, counts in rows:
            out.append(f"  {name:<22}" + "".join(f"{n:>9}" for n in counts))
        if self.kills:
            when = a.killed_when
            out.append(
                f"  (in the killed worker: no answer, on one of the {a.killed_connections} "
                f"connections it held: {when.in_flight} in flight when it was stopped, "
                f"{when.while_stopped} sent between its SIGSTOP and SIGKILL, {when.after_kill} "
                "sent on its dead connections after. Nobody can answer those; they are "
                "counted, not gated)"
            )
        return out

    def _phases_table(self, a: Account) -> list[str]:
        out = [
            f"  {'phase':<19}{'t (s)':>13}{'requests':>10}{'2xx':>8}{'refused':>9}"
            f"{'errors':>8}{'killed':>8}{'lost':>6}{'p99 ms':>9}  versions"
        ]
        for p in a.phases:
            t = p.tally
            out.append(
                f"  {p.name:<19}{p.started_s:6.1f}-{p.ended_s:<6.1f}{t.total:>10}{t.answered:>8}"
                f"{sum(t.refused.values()):>9}{t.error:>8}{t.killed:>8}{t.lost:>6}"
                f"{_ms(p.latency.p99_ms):>9}  {','.join(map(str, p.versions)) or '-'}"
            )
        return out


def _problems(title: str, problems: tuple[Problem, ...]) -> list[str]:
    if not problems:
        return [f"{title}: none"]
    out = [f"{title}: {sum(p.count for p in problems)}"]
    for p in problems[:ROWS_SHOWN]:
        sources = ",".join(p.sources)
        out.append(f"  {p.count:>6} x  first at t={p.first_at_s:.2f}s ({sources})  {p.what[:300]}")
    if len(problems) > ROWS_SHOWN:
        out.append(f"  ... {len(problems) - ROWS_SHOWN} more kinds (see --json)")
    return out


def _latency(latency: Latency) -> str:
    if not latency.count:
        return "none answered"
    return (
        f"p50 {_ms(latency.p50_ms)} ms, p99 {_ms(latency.p99_ms)} ms, max {_ms(latency.max_ms)} "
        f"ms over {latency.count} requests"
    )


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _finite(value: Any) -> Any:
    """JSON has no NaN: None instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, frozenset | set):
        return sorted(value)
    return value
