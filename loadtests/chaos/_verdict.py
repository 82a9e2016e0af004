"""The gates of a chaos run: what must hold for it to pass (exit code 0)."""

from __future__ import annotations

from dataclasses import dataclass

from loadtests.chaos._accounting import Account
from loadtests.chaos._faults import FaultLog, FaultResult


@dataclass(frozen=True)
class Gate:
    name: str
    passed: bool
    detail: str


def gates(account: Account, faults: list[FaultLog], p99_ms: float) -> list[Gate]:
    total, latency = account.total, account.latency
    failed_faults = [f for f in faults if f.result is FaultResult.FAILED]
    cool_down = account.phases[-1] if account.phases else None
    answered_at_end = cool_down.tally.answered if cool_down else 0
    return [
        Gate(
            "lost",
            total.lost == 0,
            f"{total.lost} requests lost (no answer, outside the killed worker); must be 0",
        ),
        Gate(
            "errors",
            total.error == 0,
            f"{total.error} answers with a status other than 2xx/429/503/504; must be 0",
        ),
        Gate(
            "p99",
            latency.count > 0 and latency.p99_ms <= p99_ms,
            f"p99 of answered requests {latency.p99_ms:.1f} ms; must be <= {p99_ms:g} ms"
            if latency.count
            else "no request was answered",
        ),
        Gate(
            "faults",
            not failed_faults,
            "every fault behaved"
            if not failed_faults
            else "failed: " + ", ".join(f.kind.value for f in failed_faults),
        ),
        Gate(
            "recovered",
            answered_at_end > 0,
            f"{answered_at_end} requests answered in the cool-down after the last fault; "
            "must be > 0",
        ),
    ]
