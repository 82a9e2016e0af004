"""A short headless locust run on loadtests/ against a live server: its gates and reports."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from client import PolicyClient
from tests.e2e.server import Server
from tests.load.conftest import DEMO_REPOSITORY
from tests.load.locust_runs import run_locust

TOKEN = "locust-gates-token"


def test_a_short_run_on_the_demo_policy_passes_its_gates_and_writes_csv_and_html(
    rlserve: Server, tmp_path: Path
) -> None:
    run = run_locust(rlserve.url, tmp_path, "--html", str(tmp_path / "report.html"))
    assert run.code == 0, run.output
    assert "GATES PASSED" in run.output
    assert run.requests > 500
    assert run.failures == 0
    assert "predict cartpole x1" in (tmp_path / "report.html").read_text()


def test_the_same_run_with_a_p99_target_of_a_hundredth_of_a_millisecond_fails_and_says_why(
    rlserve: Server, tmp_path: Path
) -> None:
    run = run_locust(rlserve.url, tmp_path, "--p99-ms", "0.01")
    failed = [line for line in run.output.splitlines() if line.startswith("GATE FAILED")]
    assert run.code == 1
    assert len(failed) == 1, run.output
    assert re.fullmatch(r"GATE FAILED: p99 latency \d+ ms > --p99-ms 0.01", failed[0])


def test_429_queue_full_answers_are_failures_for_the_failure_gate(tmp_path: Path) -> None:
    # A held model whose queue holds 4 rows keeps one request of 3 queued for the whole run
    # (its deadline is longer than the run): every other request is refused 429.
    env = {"RLSERVE_ADMIN_TOKEN": TOKEN, "RLSERVE_DEFAULT_DEADLINE_MS": "30000"}
    server = Server.rlserve(
        tmp_repository(tmp_path), "--max-queue-rows", "4", env=env, log=tmp_path / "log"
    )
    try:
        server.wait_ready()
        with PolicyClient(server.url, admin_token=TOKEN) as admin:
            admin.hold("cartpole", max_hold_s=60)
        # 5 s, not 2: with both cores busy (make test under load) locust once stopped before
        # its users had sent anything, and the gate then said "no predict request was made"
        run = run_locust(server.url, tmp_path, "--batch-rows", "3", "VectorEnvUser", seconds=5)
        with PolicyClient(server.url, admin_token=TOKEN) as admin:
            admin.resume("cartpole")  # the queued request runs: the stop need not wait for it
    finally:
        server.stop()
    assert run.code == 1
    assert "GATE FAILED: fail ratio" in run.output
    assert all("429" in error for error in run.errors()), run.errors()


def tmp_repository(tmp_path: Path) -> Path:
    """A copy of the demo repository (a hold is recorded in the repository)."""
    copy = tmp_path / "repository"
    shutil.copytree(DEMO_REPOSITORY, copy)
    return copy


def test_an_open_loop_run_reports_the_rate_it_reached(rlserve: Server, tmp_path: Path) -> None:
    run = run_locust(rlserve.url, tmp_path, "--rate-per-user", "20", users=2, seconds=3)
    assert run.code == 0, run.output
    assert "open loop: target 20 req/s per user, achieved" in run.output
    assert "TARGET RATE NOT REACHED" not in run.output
