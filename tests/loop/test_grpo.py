"""GRPO through a real server, co-located (``examples/grpo_colocated.py`` as users run it):
the server is the run's child, the prompt worker samples groups with ``n`` and publishes
completions into the in-process buffer, the trainer checks their recorded log-probs
against its own, steps, exports with the parity gate and pushes each version by path.

The unmarked test runs three cycles (about 20 s): every batch of the serving version
(staleness 0), its log-probs within 1e-4 of the trainer's, every record committed, every
version pushed and served. ``-m slow`` runs the toy task until the mean reward of three
batches in a row reaches 0.8 (from under 0.2; about 80 cycles of 32 groups, 80 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loop.buffers import open_producer
from tests.e2e.server import Server
from tests.loop.buffers.contract import wait_for
from tests.loop.event_files import scalars

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "grpo_colocated.py"


def run(tiny_policies: Any, tmp: Path, *flags: str, timeout_s: float) -> tuple[int, list[dict]]:
    """The co-located script: its exit status, each cycle's line, then its summary."""
    return run_script(SCRIPT, tiny_policies, tmp, *flags, timeout_s=timeout_s)


def run_script(
    script: Path, tiny_policies: Any, tmp: Path, *flags: str, timeout_s: float
) -> tuple[int, list[dict]]:
    log = tmp / "log.jsonl"
    done = subprocess.run(
        [sys.executable, str(script), "--policy", str(tiny_policies.llama_base),
         "--serve-repository", str(tmp / "models"), "--log-json", str(log),
         "--logdir", str(tmp / "runs"), *flags],
        capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-3000:]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return done.returncode, [*lines, json.loads(done.stdout.strip().splitlines()[-1])]


def test_grpo_cycles_through_the_server_with_staleness_0_and_matching_log_probs(
    tiny_policies: Any, tmp_path: Path
) -> None:
    flags = ["--max-cycles", "3", "--groups", "4", "--group-size", "4"]
    _, records = run(tiny_policies, tmp_path, *flags, timeout_s=300)
    *cycles, summary = records
    assert [c["version"] for c in cycles] == [2, 3, 4]
    assert all(c["log_prob_error"] <= 1e-4 for c in cycles), cycles
    assert all(c["completions"] == 16 and c["groups"] == 4 for c in cycles)
    assert summary["cycles"] == 3
    accounting = summary["accounting"]
    assert accounting["consumed"] == accounting["committed"] == 48
    assert accounting["dropped"] == accounting["duplicates"] == 0
    versions = sorted(int(p.name) for p in (tmp_path / "models" / "assistant").glob("[0-9]*"))
    assert versions == [1, 2, 3, 4]  # each pushed by path, tokenizer and all
    # one TensorBoard point per version, read back with TensorBoard's own reader
    rewards = scalars(tmp_path / "runs", "reward/mean")
    assert [step for step, _ in rewards] == [2, 3, 4]
    assert [v for _, v in rewards] == pytest.approx([c["mean_reward"] for c in cycles])


def test_a_lora_adapter_trains_and_each_version_is_it_merged(
    tiny_policies: Any, tmp_path: Path
) -> None:
    """--lora-rank: only the adapter trains; each version serves it merged into the base,
    and the served log-probs are the trainer's (the adapter's) within 1e-4."""
    flags = ["--max-cycles", "2", "--groups", "4", "--group-size", "4", "--lora-rank", "4",
             "--learning-rate", "2e-2"]  # fmt: skip
    _, records = run(tiny_policies, tmp_path, *flags, timeout_s=300)
    *cycles, _ = records
    assert [c["version"] for c in cycles] == [2, 3]
    assert all(c["log_prob_error"] <= 1e-4 for c in cycles), cycles


@pytest.mark.slow
def test_grpo_learns_the_toy_task_through_the_server(tiny_policies: Any, tmp_path: Path) -> None:
    status, records = run(tiny_policies, tmp_path, timeout_s=900)
    *cycles, summary = records
    assert status == 0, summary
    assert summary["window_reward"] >= 0.8
    assert sum(c["mean_reward"] for c in cycles[:3]) / 3 < 0.3  # it could not at the start
    assert max(c["log_prob_error"] for c in cycles) <= 1e-4


DECOUPLED = ROOT / "examples" / "grpo_decoupled.py"


def run_decoupled(
    tiny_policies: Any, tmp: Path, *flags: str, timeout_s: float
) -> tuple[int, list[dict]]:
    """The decoupled script: its exit status, each version's line, then its summary."""
    return run_script(DECOUPLED, tiny_policies, tmp, *flags, timeout_s=timeout_s)


def test_decoupled_grpo_samples_while_it_trains_with_bounded_staleness(
    tiny_policies: Any, tmp_path: Path
) -> None:
    """Two worker threads sample from whatever version serves while the trainer learns and
    pushes: no batch holds a group older than --max-staleness, the groups of the trainer's
    own version match its log-probs, and every completion taken is committed."""
    flags = ["--max-versions", "4", "--batch-groups", "8", "--groups", "4", "--group-size", "4",
             "--max-staleness", "1"]  # fmt: skip
    _, records = run_decoupled(tiny_policies, tmp_path, *flags, timeout_s=300)
    *versions, summary = records
    assert [v["version"] for v in versions] == [2, 3, 4, 5]
    assert all(max(v["batch_staleness"]) <= 1 for v in versions), versions
    assert summary["staleness_max"] <= 1
    assert summary["checked_groups"] > 0
    assert summary["log_prob_error_max"] <= 1e-4
    accounting = summary["accounting"]
    assert accounting["committed"] == accounting["consumed"] + accounting["dropped"]
    assert accounting["duplicates"] == 0


def test_a_prompt_worker_stops_within_2_s_of_sigterm_against_a_full_buffer(
    tiny_policies: Any, tmp_path: Path
) -> None:
    """A worker process (--role worker) whose buffer is full and has no trainer: SIGTERM
    ends it within 2 s, exit 0, its summary counting what it published and what the buffer
    did not take (issue 44: workers that stop when told)."""
    # a served repository: versions 1 and 2
    run(tiny_policies, tmp_path, "--max-cycles", "1", "--groups", "2", "--group-size", "2",
        timeout_s=300)  # fmt: skip
    server = Server.rlserve(tmp_path / "models", log=tmp_path / "server.log")
    buffer = (tmp_path / "experience").as_uri()
    try:
        server.wait_ready()
        worker = subprocess.Popen(
            [sys.executable, str(DECOUPLED), "--role", "worker", "--server", server.url,
             "--buffer", buffer, "--batch-groups", "1", "--groups", "1", "--group-size", "2"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        producer = open_producer(buffer)
        wait_for(lambda: producer.pending() >= 2, 60, "the worker to fill its buffer")
        producer.close()
        stopped = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
        took = time.monotonic() - stopped
    finally:
        server.stop()
    assert worker.returncode == 0, err[-3000:]
    assert took < 2.0, f"stopped {took:.2f} s after SIGTERM"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["published"] == 2
    assert summary["unaccepted"] in (0, 2)  # 2 when the signal came while it waited for room


@pytest.mark.slow
def test_decoupled_grpo_learns_the_toy_task(tiny_policies: Any, tmp_path: Path) -> None:
    status, records = run_decoupled(tiny_policies, tmp_path, timeout_s=900)
    summary = records[-1]
    assert status == 0, summary
    assert summary["window_reward"] >= 0.8
    assert summary["staleness_max"] <= 1
    assert summary["log_prob_error_max"] <= 1e-4


REFERENCE = ROOT / "configs"


def test_both_layouts_take_the_reference_configuration_as_written(
    tiny_policies: Any, tmp_path: Path
) -> None:
    """rl_config.yaml (co-located: its task_schedule) and decoupled_config.yaml with
    sync_policy.yaml (its Kafka buffer and 10.0.0.x endpoints replaced by flags, which win;
    its max_staleness 100 and offline fallback kept)."""
    small = ["--groups", "4", "--group-size", "4"]
    colocated = tmp_path / "colocated"
    _, records = run(
        tiny_policies, colocated, "--config", str(REFERENCE / "rl_config.yaml"),
        "--max-cycles", "2", *small, timeout_s=300,
    )  # fmt: skip
    assert [r["version"] for r in records[:-1]] == [2, 3]
    decoupled = tmp_path / "decoupled"
    buffer = (tmp_path / "log").as_uri()
    _, records = run_decoupled(
        tiny_policies, decoupled, "--config", str(REFERENCE / "decoupled_config.yaml"),
        str(REFERENCE / "sync_policy.yaml"), "--buffer", f"{buffer}/rl_experience",
        "--offline-buffer", f"{buffer}/rl_experience_offline", "--max-versions", "2",
        "--batch-groups", "4", *small, timeout_s=300,
    )  # fmt: skip
    *versions, summary = records
    assert [v["version"] for v in versions] == [2, 3]
    assert summary["accounting"]["committed"] >= 32
