"""Learning through the server, co-located (issue #11, item 5, and its first criterion).

One node, one process tree, started with ONE command as documented:
``python examples/ppo_trainer.py --config rl_config.yaml --serve-repository DIR`` with the
reference file unchanged (``cluster_mode: co-located`` selects
``examples/ppo_colocated.py``; flags add the repository, the model and the checkpoint).
That process starts ``rlserve serve`` on DIR as its child (``loop/child_server.py``: the
admin token, a free port, the server's output in ``--serve-log``), runs two in-process
rollout workers of 16 CartPole envs on a ``memory://`` buffer and the trainer, and
``loop.colocated.ColocatedRunner`` alternates: collect one batch of 4096 records with the
served version, then hold the model, learn, export, push the next version, resume. At the
end it stops the server. The slow seeds run the other documented form: ``rlserve serve``
started separately, the trainer given ``--server URL``.

Asserted from what the trainer logged per update (``--log-json``) and from the server:

- the budget: the mean return of the last 100 episodes in the records reaches 475 within
  ``BUDGET_ENV_STEPS`` = 150,000 env steps (measured, docs/rl-loop.md "Co-located mode":
  91-111 k steps, 36-50 s, for seeds 1-5), with ``pytest -m slow``; the unmarked test is
  its slimmer form for ``make test``'s time, seed 1 until the mean return reaches
  ``SLIM_TARGET_RETURN`` = 200 (a random policy's is about 22), every other assertion kept;
- staleness 0: every record of every batch has ``model_version`` equal to the trainer's
  version, and so has every row trained on;
- the server was held during every training turn: the hold's answer, the model's state
  read back just before resume (held, the pushed version active), and the server's own log
  (one ``held`` and one ``resumed`` line per update);
- the turns alternate (inference, training, inference, ...; each ends before the next
  starts) and none is shorter than its ``task_schedule`` quantum (10 ms, 50 ms), each a
  whole number of quanta;
- a child server listens on a local lane too, and the workers predict through it (a
  separate server, whose lane the reference file does not name, over HTTP);
- the server's active version is the last one pushed (read back from the server, or from
  the repository's serving state once the child server is gone), and a child server was
  stopped with the trainer: its log ends with its shutdown, and its process is gone.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from client import PolicyClient
from loop.child_server import free_port
from serve.control.store import STATE_FILE
from tests.e2e.server import Server
from tests.loop.event_files import rises, scalars

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "examples" / "ppo_trainer.py"
REFERENCE = ROOT / "configs" / "rl_config.yaml"
TOKEN = "colocated-test-token"
MODEL = "cartpole"
BUDGET_ENV_STEPS = 150_000
TARGET_RETURN = 475.0
SLIM_TARGET_RETURN = 200.0  # the unmarked test's target: learning, at a fraction of the run
INFERENCE_S, TRAINING_S = 0.010, 0.050  # the reference file's task_schedule


@dataclass
class Learned:
    returncode: int
    summary: dict[str, Any]
    updates: list[dict[str, Any]]
    active_version: int
    server_log: str
    wall_s: float
    stderr: str
    child_pid: int | None = None  # the trainer's child server


def learn(
    tmp: Path,
    seed: int,
    budget: int = BUDGET_ENV_STEPS,
    timeout_s: float = 240,
    *,
    child_server: bool = True,
    target: float = TARGET_RETURN,
) -> Learned:
    """Version 1 and the checkpoint, then the co-located run: one command starting the
    server as its child (``child_server``), else with a server started here."""
    repository, checkpoint, log = tmp / "repository", tmp / "agent.pt", tmp / "updates.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLSERVE_ADMIN_TOKEN": TOKEN}
    subprocess.run(
        [sys.executable, str(TRAINER), "--init-repository", str(repository), "--model", MODEL,
         "--checkpoint", str(checkpoint), "--seed", str(seed)],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    command = [
        sys.executable, str(TRAINER), "--config", str(REFERENCE), "--model", MODEL,
        "--checkpoint", str(checkpoint), "--seed", str(seed), "--target-return",
        str(target), "--max-env-steps", str(budget), "--log-json", str(log),
        "--metrics-port", str(free_port()),  # not the reference's 9400: other tests run too
        "--logdir", str(tmp / "runs"),
    ]  # fmt: skip
    if child_server:  # as documented: no token to set, the runner makes its server's
        without_token = {k: v for k, v in env.items() if k != "RLSERVE_ADMIN_TOKEN"}
        server_log = tmp / "server.log"
        started = time.monotonic()
        run = subprocess.run(
            [*command, "--serve-repository", str(repository), "--serve-log", str(server_log)],
            cwd=ROOT, env=without_token, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        wall_s = time.monotonic() - started
        state = repository / MODEL / STATE_FILE
        # a trainer that failed early wrote none: check() then shows its stderr
        active = int(json.loads(state.read_text())["active"]) if state.exists() else -1
        output = server_log.read_text() if server_log.exists() else ""
        found = re.search(r"started rlserve serve on .* as pid (\d+)", run.stderr)
        child_pid = int(found.group(1)) if found else None
    else:
        server = Server.rlserve(
            repository, env={"RLSERVE_ADMIN_TOKEN": TOKEN}, log=tmp / "server.log"
        )
        try:
            server.wait_ready()
            started = time.monotonic()
            run = subprocess.run(
                [*command, "--server", server.url],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
            )  # fmt: skip
            wall_s = time.monotonic() - started
            with PolicyClient(server.url) as client:
                active = int(client.model(MODEL)["active_version"])
        finally:
            server.stop()
        output, child_pid = server.output(full=True), None
    (tmp / "trainer.err").write_text(run.stderr)
    lines = run.stdout.strip().splitlines()
    return Learned(
        returncode=run.returncode,
        summary=json.loads(lines[-1]) if lines else {},
        updates=[json.loads(line) for line in log.read_text().splitlines()] if log.exists() else [],
        active_version=active,
        server_log=output,
        wall_s=wall_s,
        stderr=run.stderr,
        child_pid=child_pid,
    )


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def check(learned: Learned, target: float = TARGET_RETURN) -> None:
    summary, updates = learned.summary, learned.updates
    assert learned.returncode == 0, learned.stderr[-4000:]
    assert summary["reached"]
    assert summary["mean_return"] >= target
    assert summary["env_steps"] <= BUDGET_ENV_STEPS
    versions = [u["version"] for u in updates]
    assert versions == list(range(2, len(updates) + 2))
    assert learned.active_version == summary["version"] == versions[-1]
    assert summary["log_prob_error_max"] <= 1e-5
    assert summary["accounting"]["dropped"] == summary["accounting"]["duplicates"] == 0
    previous_end = -math.inf
    for update in updates:
        version = update["version"]
        # Staleness 0: each batch's records were all made by the version trained on.
        assert update["batch_version"] == version - 1
        assert update["record_versions"] == [version - 1, version - 1]
        assert update["trained_staleness_max"] == 0
        assert update["log_prob_error"] is not None
        assert update["log_prob_error"] <= 1e-5
        inference, training = update["phases"]
        assert (inference["kind"], training["kind"]) == ("inference", "training")
        assert inference["version"] == training["version"] == version - 1
        # One batch: what the turn published, >= 4096, less than one more round (32 envs).
        assert 4096 <= inference["records"] == training["records"] < 4096 + 32
        assert update["env_steps"] == sum(u["phases"][0]["records"] for u in updates[: version - 1])
        # Alternation, and the task_schedule quanta as minimum turn lengths.
        assert previous_end <= inference["started"] < inference["ended"]
        assert inference["ended"] <= training["started"] < training["ended"]
        previous_end = training["ended"]
        for phase, quantum in ((inference, INFERENCE_S), (training, TRAINING_S)):
            assert phase["quantum_s"] == quantum
            assert phase["seconds"] >= quantum
            assert phase["seconds"] >= phase["work_s"]
        # Held for the whole training turn: the push landed while held, still held after.
        assert training["held"] is True
        assert training["held_at_resume"] is True
        assert training["push_result"] == "activated"
        assert training["push_active_version"] == version
    # A child server has a local lane, and the workers predicted through it; a separate
    # server (the reference config names no lane) over HTTP.
    through = "lane" if learned.child_pid is not None else "http"
    assert {u["predictions"] for u in updates} == {through}
    assert ("rlserve.lane: local lane at" in learned.server_log) == (through == "lane")
    assert all(u["inference_s"] > 0 and u["training_s"] > 0 for u in updates)
    # The server's own account: one hold and one resume per update.
    assert learned.server_log.count(f"model {MODEL} held for") == len(updates)
    assert learned.server_log.count(f"model {MODEL} resumed") == len(updates)
    assert "reached max_hold_s" not in learned.server_log


def check_child_stopped(learned: Learned) -> None:
    """The trainer stopped its server on the way out: SIGTERM, drained, exited, reaped."""
    assert learned.child_pid is not None, learned.stderr[-4000:]
    assert gone(learned.child_pid)
    lines = learned.server_log.rstrip().splitlines()
    assert "rlserve.phases: draining" in learned.server_log  # SIGTERM, not SIGKILL
    assert lines[-1].endswith(f"Finished server process [{learned.child_pid}]"), lines[-8:]


def test_colocated_ppo_learns_cartpole_with_zero_staleness(tmp_path: Path) -> None:
    learned = learn(tmp_path, seed=1, target=SLIM_TARGET_RETURN)  # the slimmer form
    check(learned, SLIM_TARGET_RETURN)
    check_child_stopped(learned)
    # the run ends saying where its last version is and how to serve it
    last = learned.summary["version"]
    served = tmp_path / "repository" / MODEL / str(last) / "model.onnx"
    assert f"last version {last} of {MODEL}: mean return" in learned.stderr
    assert f".venv/bin/rlserve serve {served}" in learned.stderr
    assert served.is_file()
    # TensorBoard's reader loads the run's event files, and the return rises
    returns = scalars(tmp_path / "runs", "charts/mean_return")
    assert rises(returns), returns
    assert scalars(tmp_path / "runs", "rl/policy_version")[-1][1] == last


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_colocated_ppo_learns_cartpole_other_seeds(tmp_path: Path, seed: int) -> None:
    check(learn(tmp_path, seed=seed, child_server=False))
