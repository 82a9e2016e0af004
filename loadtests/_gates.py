"""The pass/fail gates, checked when locust quits: P99 latency and failure ratio.

Every request that locust measures here is a predict request (the contract is fetched
outside its statistics), so the gates read locust's aggregated total. Every non-2xx answer
is a failure, 429 (queue full) included, and so is a connection error. A failed gate sets
the exit code to 1 and prints the gate with the measured value; otherwise one PASS line.
Only the process holding the aggregated statistics decides: a standalone locust, or the
master of a distributed run.
"""

from __future__ import annotations

from typing import Any

from locust import events
from locust.runners import WorkerRunner

from _options import LoadOptions


@events.quitting.add_listener
def _apply_gates(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    failed = failed_gates(environment)
    for line in failed:
        print(f"GATE FAILED: {line}", flush=True)
    if not failed:
        print(f"GATES PASSED: {summary(environment)}", flush=True)
    environment.process_exit_code = 1 if failed else 0


def failed_gates(environment: Any) -> list[str]:
    total, options = environment.stats.total, LoadOptions.of(environment)
    if total.num_requests == 0:
        return ["no predict request was made (is the server up? see the errors above)"]
    checks = (_latency(total, options), _failures(total, options), _crashes(environment))
    return [failure for failure in checks if failure is not None]


def _latency(total: Any, options: LoadOptions) -> str | None:
    p99 = total.get_response_time_percentile(0.99)
    if p99 <= options.p99_ms:
        return None
    return f"p99 latency {p99:g} ms > --p99-ms {options.p99_ms:g}"


def _failures(total: Any, options: LoadOptions) -> str | None:
    if total.fail_ratio <= options.max_fail_ratio:
        return None
    return (
        f"fail ratio {total.fail_ratio:.4f} ({total.num_failures} of {total.num_requests}) "
        f"> --max-fail-ratio {options.max_fail_ratio:g}"
    )


def _crashes(environment: Any) -> str | None:
    count = sum(row["count"] for row in environment.runner.exceptions.values())
    return f"{count} exceptions in the load test's own code (see above)" if count else None


def summary(environment: Any) -> str:
    total, options = environment.stats.total, LoadOptions.of(environment)
    percentile = total.get_response_time_percentile
    return (
        f"{total.num_requests} predict requests at {total.total_rps:.1f} req/s; "
        f"p50 {percentile(0.5):g} ms, p99 {percentile(0.99):g} ms (<= {options.p99_ms:g}); "
        f"fail ratio {total.fail_ratio:.4f} (<= {options.max_fail_ratio:g})"
    )
