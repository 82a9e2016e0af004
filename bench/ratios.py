"""One load run's figures against a reference run of the same scenario: the floor (bare
ASGI on uvicorn) or the plain FastAPI baseline.

Each ratio is the run's figure divided by the reference's: above 1 is more requests/s, but
also more latency and more CPU per request. The p50 gap is the difference in milliseconds,
what a fixed per-request cost on top of the reference's shows as at one connection.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.results import LoadRun


@dataclass(frozen=True)
class Ratios:
    """``run`` ÷ ``reference``, figure by figure; None where the reference's figure is 0."""

    requests_per_s: float | None
    p50: float | None
    p99: float | None
    cpu_per_request: float | None
    p50_gap_ms: float  # the run's p50 minus the reference's


def against(run: LoadRun, reference: LoadRun) -> Ratios:
    mine, theirs = run.load, reference.load
    return Ratios(
        requests_per_s=ratio(mine.requests_per_s, theirs.requests_per_s),
        p50=ratio(mine.p50_ms, theirs.p50_ms),
        p99=ratio(mine.p99_ms, theirs.p99_ms),
        cpu_per_request=ratio(run.cpu_us_per_request, reference.cpu_us_per_request),
        p50_gap_ms=mine.p50_ms - theirs.p50_ms,
    )


def ratio(value: float, reference: float) -> float | None:
    """``value`` ÷ ``reference``, or None when the reference is 0 (nothing measured)."""
    return value / reference if reference > 0 else None
