"""Every request the load sent, in exactly one row, and the latency of the answered ones.

The rows (:class:`Outcome`):

- **answered**: a 2xx answer;
- **refused**: 429 (queue full), 503 (unavailable, draining) or 504 (deadline passed): the
  server said no, quickly and in words, which it may under faults;
- **error**: any other HTTP status: a server bug under this fault (must be 0);
- **killed**: no answer, on a connection that the SIGKILLed worker held when it was stopped
  (in flight inside it, or sent on its dead connection just after). Nobody can answer
  those: they are counted, not hidden, and not gated;
- **lost**: no answer at all otherwise: a reset, a closed connection, a timeout (must be 0).

Latency is the client's, from the first byte sent to the last byte read, of answered
requests from the steady and burst users (a slow client's latency is its own slowness).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from loadtests.chaos._faults import FaultLog, KillEvent
from loadtests.chaos._records import RequestRecord, Source

ALLOWED_REFUSALS = frozenset({429, 503, 504})
# A request on a killed worker's connection that began this long after the kill is not
# attributed to it (the connection's port may have been reused by then).
KILL_GRACE_S = 2.0


class Outcome(StrEnum):
    ANSWERED = "answered"
    REFUSED = "refused"
    ERROR = "error"
    KILLED = "killed"
    LOST = "lost"


def outcome(record: RequestRecord, kills: Sequence[KillEvent], timeout_s: float) -> Outcome:
    if 200 <= record.status < 300:
        return Outcome.ANSWERED
    if record.status in ALLOWED_REFUSALS:
        return Outcome.REFUSED
    if record.status:
        return Outcome.ERROR
    for kill in kills:
        if (
            record.port in kill.ports
            and kill.stopped_at - timeout_s <= record.started <= kill.killed_at + KILL_GRACE_S
            and record.ended >= kill.stopped_at
        ):
            return Outcome.KILLED
    return Outcome.LOST


@dataclass
class Tally:
    answered: int = 0
    refused: dict[int, int] = field(default_factory=dict)  # by status
    error: int = 0
    killed: int = 0
    lost: int = 0

    @property
    def total(self) -> int:
        return self.answered + sum(self.refused.values()) + self.error + self.killed + self.lost

    def add(self, result: Outcome, status: int) -> None:
        if result is Outcome.REFUSED:
            self.refused[status] = self.refused.get(status, 0) + 1
        else:
            setattr(self, result.value, getattr(self, result.value) + 1)


@dataclass(frozen=True)
class Latency:
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, values_ms: Iterable[float]) -> Latency:
        ordered = sorted(values_ms)
        if not ordered:
            return cls(0, math.nan, math.nan, math.nan)
        return cls(len(ordered), _rank(ordered, 0.5), _rank(ordered, 0.99), ordered[-1])


def _rank(ordered: list[float], quantile: float) -> float:
    """The nearest-rank percentile of sorted values."""
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]


@dataclass(frozen=True)
class Problem:
    """Requests that failed the same way: an HTTP status with its body, or a client error."""

    what: str
    count: int
    first_at_s: float  # since the load started
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Phase:
    """The requests that started while one fault (or the warm-up, or the cool-down) ran."""

    name: str
    started_s: float
    ended_s: float
    tally: Tally
    latency: Latency
    versions: tuple[int, ...]  # the policy versions that answered


@dataclass(frozen=True)
class Account:
    total: Tally
    by_source: dict[str, Tally]
    latency: Latency
    latency_by_source: dict[str, Latency]
    errors: tuple[Problem, ...]
    lost: tuple[Problem, ...]
    killed_connections: int  # the connections the killed workers held
    killed_when: KilledWhen
    phases: tuple[Phase, ...]


@dataclass(frozen=True)
class KilledWhen:
    """The killed row by when its requests were sent, relative to the SIGSTOP and SIGKILL."""

    in_flight: int  # before the worker was stopped: it was working on them
    while_stopped: int  # between SIGSTOP and SIGKILL: they waited in its socket buffers
    after_kill: int  # after SIGKILL, on a connection the client did not know was dead yet


def account(
    records: Sequence[RequestRecord],
    kills: Sequence[KillEvent],
    faults: Sequence[FaultLog],
    load_started: float,
    load_ended: float,
    timeout_s: float,
) -> Account:
    results = [outcome(r, kills, timeout_s) for r in records]
    total, by_source = Tally(), {source.value: Tally() for source in Source}
    for record, result in zip(records, results, strict=True):
        total.add(result, record.status)
        by_source[record.source.value].add(result, record.status)
    timed = [r for r, o in zip(records, results, strict=True) if o is Outcome.ANSWERED]
    measured = [r for r in timed if r.source is not Source.SLOW]
    return Account(
        total=total,
        by_source={name: tally for name, tally in by_source.items() if tally.total},
        latency=Latency.of(r.latency_ms for r in measured),
        latency_by_source={
            source.value: Latency.of(r.latency_ms for r in timed if r.source is source)
            for source in Source
            if any(r.source is source for r in timed)
        },
        errors=_problems(records, results, Outcome.ERROR, load_started),
        lost=_problems(records, results, Outcome.LOST, load_started),
        killed_connections=sum(len(k.ports) for k in kills),
        killed_when=_killed_when(
            [r for r, o in zip(records, results, strict=True) if o is Outcome.KILLED], kills
        ),
        phases=_phases(records, results, faults, load_started, load_ended),
    )


def _killed_when(killed: Sequence[RequestRecord], kills: Sequence[KillEvent]) -> KilledWhen:
    when: Counter[str] = Counter()
    for record in killed:
        kill = next(k for k in kills if record.port in k.ports and record.ended >= k.stopped_at)
        if record.started < kill.stopped_at:
            when["in_flight"] += 1
        elif record.started < kill.killed_at:
            when["while_stopped"] += 1
        else:
            when["after_kill"] += 1
    return KilledWhen(when["in_flight"], when["while_stopped"], when["after_kill"])


def _problems(
    records: Sequence[RequestRecord],
    results: Sequence[Outcome],
    wanted: Outcome,
    load_started: float,
) -> tuple[Problem, ...]:
    count: Counter[str] = Counter()
    first: dict[str, float] = {}
    sources: dict[str, set[str]] = {}
    for record, result in zip(records, results, strict=True):
        if result is not wanted:
            continue
        what = (
            f"HTTP {record.status}: {' '.join(record.body.split())}"
            if record.status
            else f"no answer ({record.stage.value}): {record.error}"
        )
        count[what] += 1
        first[what] = min(first.get(what, math.inf), record.started - load_started)
        sources.setdefault(what, set()).add(record.source.value)
    return tuple(
        Problem(what, n, first[what], tuple(sorted(sources[what])))
        for what, n in count.most_common()
    )


def _phases(
    records: Sequence[RequestRecord],
    results: Sequence[Outcome],
    faults: Sequence[FaultLog],
    load_started: float,
    load_ended: float,
) -> tuple[Phase, ...]:
    bounds = [("warm-up", load_started)]
    bounds += [(f.kind.value, f.started) for f in faults]
    last_fault_end = max((f.ended for f in faults), default=load_started)
    bounds.append(("cool-down", last_fault_end))
    phases = []
    for i, (name, start) in enumerate(bounds):
        end = bounds[i + 1][1] if i + 1 < len(bounds) else load_ended
        tally, latencies, versions = Tally(), [], set()
        for record, result in zip(records, results, strict=True):
            if start <= record.started < end or (name == "cool-down" and record.started >= end):
                tally.add(result, record.status)
                if result is Outcome.ANSWERED:
                    versions.add(record.version)
                    if record.source is not Source.SLOW:
                        latencies.append(record.latency_ms)
        phases.append(
            Phase(
                name,
                start - load_started,
                end - load_started,
                tally,
                Latency.of(latencies),
                tuple(sorted(versions)),
            )
        )
    return tuple(phases)
