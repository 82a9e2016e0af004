"""Recurrent policies (issue #22): the ``recurrent`` scenario.

A RecurrentPPO ``MlpLstmPolicy`` (CartPole's spaces, 64-unit LSTMs for actor and critic: a
state of 256 floats per step) is built untrained and exported with ``rlserve export sb3``
(parity gate included). ``rlserve serve`` runs it on the server core; wrk on the load
core drives 64 sequences at once, each its own wrk thread with one connection, so every
sequence has one step in flight at a time, as an actor has:

- **client-held**: each step posts the observation and the ``state`` the previous answer
  returned (wrk's Lua copies the answer's ``state`` array into the next body unparsed);
  the first step sends ``episode_start: true`` instead;
- **server-held**: each step posts the observation and its ``sequence_id`` (the first
  ``sequence_start: true``); the server keeps the state.

Each mode gets ``warmup`` seconds of the same load, then ``seconds`` measured: requests/s,
p50 and p99 at the client, errors, the server's CPU time per request, and the bytes a
request and an answer carry. Target: server-held at >= 80% of client-held's requests/s.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import httpx
import orjson

from bench import cpu, load, servers
from bench.load import LoadResult

SEQUENCES = 64
HIDDEN = 64
MODEL = "recurrent"
OBSERVATION = [0.01, -0.02, 0.03, 0.04]
MIN_SERVER_HELD_SHARE = 0.8  # target: server-held requests/s against client-held's


class Mode(Enum):
    CLIENT_HELD = "client-held state"
    SERVER_HELD = "server-held state (sequence_id)"


@dataclass(frozen=True)
class RecurrentRow:
    mode: Mode
    load: LoadResult | None
    failure: str | None
    server_cpu_s: float
    request_bytes: int  # a continuing step's body
    answer_bytes: int  # its answer's body

    @property
    def server_us_per_request(self) -> float | None:
        requests = self.load.requests if self.load is not None else 0
        return self.server_cpu_s * 1e6 / requests if requests else None


@dataclass(frozen=True)
class RecurrentRun:
    when: str
    seconds: float  # the scenario's wall time
    measured_s: float
    warmup_s: float
    machine: str
    load_before: str
    load_after: str
    state_size: int
    rows: tuple[RecurrentRow, ...]
    failure: str | None  # why nothing was measured

    def row(self, mode: Mode) -> RecurrentRow | None:
        return next((r for r in self.rows if r.mode is mode), None)

    @property
    def server_held_share(self) -> float | None:
        client, held = self.row(Mode.CLIENT_HELD), self.row(Mode.SERVER_HELD)
        if client is None or held is None or client.load is None or held.load is None:
            return None
        rate = client.load.requests_per_s
        return held.load.requests_per_s / rate if rate else None


def run(workdir: Path, seconds: int, warmup: int) -> RecurrentRun:
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = cpu.loadavg()
    machine = cpu.machine()
    rows: list[RecurrentRow] = []
    failure = None
    try:
        repository = _export(workdir / "recurrent")
        server = _serve(repository, workdir)
    except (RuntimeError, TimeoutError) as exc:
        failure = str(exc)[:500]
    else:
        try:
            rows = [_measure(server, mode, seconds, warmup) for mode in Mode]
        finally:
            server.stop()
    return RecurrentRun(
        when, time.monotonic() - started, float(seconds), float(warmup), machine, load_before,
        cpu.loadavg(), 4 * HIDDEN, tuple(rows), failure,
    )  # fmt: skip


def _export(folder: Path) -> Path:
    """An untrained RecurrentPPO exported through the CLI (its parity gate included)."""
    _say(f"{MODEL}: building and exporting a RecurrentPPO MlpLstmPolicy")
    folder.mkdir(parents=True, exist_ok=True)
    build = (
        "from sb3_contrib import RecurrentPPO\n"
        "RecurrentPPO('MlpLstmPolicy', 'CartPole-v1', n_steps=16, seed=0, device='cpu', "
        f"policy_kwargs={{'lstm_hidden_size': {HIDDEN}}}).save({str(folder / 'policy.zip')!r})\n"
    )
    steps = [
        [sys.executable, "-c", build],
        [
            sys.executable, "-m", "cli", "export", "sb3", str(folder / "policy.zip"),
            "--name", MODEL, "--model-repository", str(folder / "models"),
        ],
    ]  # fmt: skip
    for command in steps:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{command[2][:40]} failed:\n{done.stdout}{done.stderr}")
    return folder / "models"


def _serve(repository: Path, workdir: Path) -> servers.Server:
    command = [
        sys.executable, "-m", "cli", "serve", "--model-repository", str(repository),
        "--max-batch-size", str(SEQUENCES),
    ]  # fmt: skip
    server = servers.Server(command, {}, workdir / "recurrent.log", cpu.SERVER_CORE)
    server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", 120)
    return server


def _measure(server: servers.Server, mode: Mode, seconds: int, warmup: int) -> RecurrentRow:
    _say(f"  {mode.value}, {SEQUENCES} sequences")
    request, answer = _sizes(server, mode)
    url = f"{server.url}/v1/models/{MODEL}/predict"
    try:
        _wrk(url, mode, warmup)
        time.sleep(0.5)  # the steps wrk left in flight answer: none is in flight at a start
        before = server.cpu_seconds()
        result = _wrk(url, mode, seconds)
        server_s = server.cpu_seconds() - before
    except RuntimeError as exc:
        return RecurrentRow(mode, None, str(exc)[:300], 0.0, request, answer)
    if result.errors:
        _say(f"  {result.errors} errors; server log:\n{server.log_tail()}")
    return RecurrentRow(mode, result, None, server_s, request, answer)


def _sizes(server: servers.Server, mode: Mode) -> tuple[int, int]:
    """The body of a continuing step and of its answer, in bytes."""
    path = f"/v1/models/{MODEL}/predict"
    with httpx.Client(base_url=server.url, timeout=10) as client:
        if mode is Mode.CLIENT_HELD:
            first = client.post(path, json={"observations": OBSERVATION, "episode_start": True})
            body = orjson.dumps({"observations": OBSERVATION, "state": first.json()["state"]})
        else:
            start = {"observations": OBSERVATION, "sequence_id": "sizes", "sequence_start": True}
            client.post(path, json=start)
            body = orjson.dumps({"observations": OBSERVATION, "sequence_id": "sizes"})
        answer = client.post(path, content=body, headers={"content-type": "application/json"})
    return len(body), len(answer.content)


def _wrk(url: str, mode: Mode, seconds: int) -> LoadResult:
    with tempfile.TemporaryDirectory(prefix="bench-recurrent-") as tmp:
        script = Path(tmp) / "steps.lua"
        script.write_text(_script(mode))
        command = [
            load.require_wrk(), f"-t{SEQUENCES}", f"-c{SEQUENCES}", f"-d{seconds}s",
            "--latency", "-s", str(script), url,
        ]  # fmt: skip
        done = subprocess.run(cpu.pinned(command, cpu.LOAD_CORE), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return load.parse(done.stdout)


def _script(mode: Mode) -> str:
    """One wrk thread per sequence, one connection each: its steps strictly alternate with
    their answers, so each thread's Lua state is one sequence's. A sequence counts as
    started once a step answers 200 (wrk calls the first thread's ``request`` once more,
    unsent, to check it)."""
    observation = orjson.dumps(OBSERVATION).decode()
    head = (
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"local observation = '{observation}'\n"
    )
    if mode is Mode.CLIENT_HELD:
        return head + (
            "local state = nil\n"
            "request = function()\n"
            "  local body\n"
            "  if state == nil then\n"
            "    body = '{\"observations\":' .. observation .. ',\"episode_start\":true}'\n"
            "  else\n"
            "    body = '{\"observations\":' .. observation .. ',\"state\":' .. state .. '}'\n"
            "  end\n"
            "  return wrk.format(nil, nil, nil, body)\n"
            "end\n"
            "response = function(status, headers, body)\n"
            "  if status == 200 then state = body:match('\"state\":(%b[])') end\n"
            "end\n"
        )
    return head + (
        "local counter = 0\n"
        "function setup(thread)\n"
        "  counter = counter + 1\n"
        '  thread:set("sequence", counter)\n'
        "end\n"
        "local started = false\n"
        "request = function()\n"
        "  local body = '{\"observations\":' .. observation .. ',\"sequence_id\":' .. sequence\n"
        "  if not started then body = body .. ',\"sequence_start\":true' end\n"
        "  return wrk.format(nil, nil, nil, body .. '}')\n"
        "end\n"
        "response = function(status, headers, body)\n"
        "  if status == 200 then started = true end\n"
        "end\n"
    )


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
