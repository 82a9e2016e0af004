"""The local lane (issue #25): the ``lane`` scenario.

One ``rlserve serve --lane PATH`` process on the server core serves the bundled CartPole
policy; the clients run on the load core, each setup over HTTP and over the lane, one
after another against the same server:

- **one actor**: one CartPole env, one predict call per step (``bench.actor``, the project's
  ``PolicyClient`` over HTTP, ``LaneClient`` over the lane);
- **eight actors**: eight such processes at once, their steps summed (the server batches
  their rows across actors);
- **one rollout worker with 64 envs**: ``loop.collect.RolloutWorker`` (the code of
  ``rlserve collect``), one call per iteration for all its envs, every step published into
  an in-process buffer a drain thread empties (``bench.loop_child worker``, with ``--lane``).

Beside them, the env's own speed: the same vector env of 64 CartPoles stepped with random
actions and no server, on the load core. Each row: ``warmup`` seconds, then ``seconds``
measured; the server's CPU time over the row, per env step.

And the lane's floors, in the same run: onnxruntime alone on the server core running the
same model.onnx back to back at batch 1 (one thread: what one call's model costs), and
the IPC floor (``bench.ipc``): a 16-byte request and its answer between two bare Python
processes through the lane's design (a memfd slot, a doorbell byte each way), with the
client blocking on its doorbell and, for reference, spinning on the answer's seq.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from bench import children, cpu, ipc, raw, servers

ENVS = 64  # the rollout worker's
ACTORS = 8
CHILD_TIMEOUT_S = 120.0
# Targets (issue #43), env steps/s through the lane (served by its default, the thread).
MIN_ONE_ACTOR = 12_000.0
MIN_EIGHT_ACTORS = 10_000.0
MIN_WORKER_SHARE = 0.9  # of the same vector env's rate alone
MIN_ONE_ACTOR_SHARE = 0.15  # one actor, of onnxruntime's batch-1 rate alone
IPC_PAYLOAD = 16  # bytes: one CartPole observation


class Transport(Enum):
    HTTP = "HTTP (PolicyClient)"
    LANE = "local lane (serving thread, the default)"
    LANE_LOOP = "local lane (`--lane-serving loop`)"

    @property
    def lane(self) -> bool:
        return self is not Transport.HTTP


class Load(Enum):
    ONE_ACTOR = "one actor, 1 env"
    EIGHT_ACTORS = f"{ACTORS} actors, 1 env each"
    WORKER = f"rollout worker, {ENVS} envs"


@dataclass(frozen=True)
class LaneRow:
    load: Load
    transport: Transport
    steps_per_s: float | None  # None: failed
    failure: str | None
    server_cpu_s: float
    rows: int  # rows the server computed for the row's clients, their warm-ups included
    waiting_share: float | None = None  # a worker's: of its measured time, in predict calls

    @property
    def server_us_per_row(self) -> float | None:
        return self.server_cpu_s * 1e6 / self.rows if self.rows else None

    @property
    def own_ceiling(self) -> float | None:
        """A worker's steps/s with answers that took no time: its own code's limit (its
        env, bookkeeping and publishing), which no transport can pass."""
        if self.steps_per_s is None or self.waiting_share is None or self.waiting_share >= 1:
            return None
        return self.steps_per_s / (1 - self.waiting_share)


@dataclass(frozen=True)
class Floors:
    """What a lane call cannot beat, measured in the same run (None: not measured)."""

    onnxruntime_rows_per_s: float | None  # the model alone, batch 1, on the server core
    round_trips_per_s: float | None  # bench.ipc's lane design, blocking doorbells
    spinning_round_trips_per_s: float | None  # the same, the client spinning


@dataclass(frozen=True)
class LaneRun:
    when: str
    seconds: float  # the scenario's wall time
    measured_s: float
    warmup_s: float
    machine: str
    load_before: str
    load_after: str
    env_steps_per_s: float | None  # the vector env of ENVS CartPoles alone
    rows: tuple[LaneRow, ...]
    failure: str | None  # why nothing was measured
    floors: Floors | None = None

    def row(self, load: Load, transport: Transport) -> LaneRow | None:
        return next((r for r in self.rows if r.load is load and r.transport is transport), None)


def run(model: Path, workdir: Path, seconds: int, warmup: int) -> LaneRun:
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = cpu.loadavg()
    machine = cpu.machine()
    lane = workdir / "bench.lane"
    rows: list[LaneRow] = []
    failure = None
    env_rate = _env_alone(seconds)
    floors = _floors(model, seconds)
    for serving, transports in _SERVINGS:
        try:
            server = _serve(model, workdir, lane, serving)
        except (RuntimeError, TimeoutError) as exc:
            failure = failure or str(exc)[:500]
            continue
        try:
            rows += [
                _measure(server, lane, load, transport, seconds, warmup)
                for load in Load
                for transport in transports
            ]
        finally:
            server.stop()
    order = list(Transport)
    rows.sort(key=lambda r: (list(Load).index(r.load), order.index(r.transport)))
    return LaneRun(
        when, time.monotonic() - started, float(seconds), float(warmup), machine, load_before,
        cpu.loadavg(), env_rate, tuple(rows), failure, floors,
    )  # fmt: skip


# Each server's lane serving (its default: the thread), and the transports measured on it.
_SERVINGS = (("thread", (Transport.HTTP, Transport.LANE)), ("loop", (Transport.LANE_LOOP,)))


def _serve(model: Path, workdir: Path, lane: Path, serving: str) -> servers.Server:
    _say(f"lane: cartpole: starting rlserve serve --lane (lane_serving {serving})")
    repository = servers.only_model(model, workdir / serving)
    command = [
        sys.executable, "-m", "cli", "serve", "--model-repository", str(repository),
        "--lane", str(lane), "--lane-serving", serving,
    ]  # fmt: skip
    server = servers.Server(command, {}, workdir / f"lane-{serving}.log", cpu.SERVER_CORE)
    server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", 120)
    return server


def _measure(
    server: servers.Server, lane: Path, load: Load, transport: Transport, seconds: int, warmup: int
) -> LaneRow:
    _say(f"lane: {load.value}, over {transport.value}")
    commands = _commands(server.url, lane, load, transport, seconds, warmup)
    before = server.cpu_seconds()
    outputs, failure = _all(commands)
    spent = server.cpu_seconds() - before
    if failure is not None:
        _say(f"lane: failed: {failure}\n{server.log_tail()[-1500:]}")
        return LaneRow(load, transport, None, failure, 0.0, 0)
    rate = sum(_rate(o, load) for o in outputs)
    served = sum(_served(o, load) for o in outputs)
    waiting = outputs[0]["predict_share"] if load is Load.WORKER else None
    return LaneRow(load, transport, rate, None, spent, served, waiting)


def _rate(output: dict[str, float], load: Load) -> float:
    """A child's measured env steps/s."""
    if load is Load.WORKER:
        return output["env_steps"] / output["seconds"] if output["seconds"] else 0.0
    return output["steps_per_s"]


def _served(output: dict[str, float], load: Load) -> int:
    """Rows the server computed for a child, its warm-up included (the server's CPU time
    covers it too): an actor's steps; a worker's requests times its envs."""
    if load is Load.WORKER:
        return int(output["all_requests"]) * ENVS
    return int(output["steps"] + output["warmup_steps"])


def _commands(
    url: str, lane: Path, load: Load, transport: Transport, seconds: int, warmup: int
) -> list[list[str]]:
    timing = ["--seconds", str(seconds), "--warmup", str(warmup)]
    if load is Load.WORKER:
        command = [
            sys.executable, "-m", "bench.loop_child", "worker", "--url", url,
            "--num-envs", str(ENVS), *timing,
        ]  # fmt: skip
        return [command + (["--lane", str(lane)] if transport.lane else [])]
    client = "lane" if transport.lane else "policy"
    command = [
        sys.executable, "-m", "bench.actor", "--url", url, "--client", client,
        "--lane", str(lane), *timing,
    ]  # fmt: skip
    return [command] * (ACTORS if load is Load.EIGHT_ACTORS else 1)


def _all(commands: list[list[str]]) -> tuple[list[dict[str, float]], str | None]:
    """Every command at once on the load core: their JSON lines, or why one has none."""
    if len(commands) == 1:
        output, failure = children.measure(commands[0], cpu.LOAD_CORE, CHILD_TIMEOUT_S)
        return [output], failure
    running = [_start(c) for c in commands]
    outputs, failure = [], None
    for process in running:
        try:
            out, err = process.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        lines = out.strip().splitlines()
        if process.returncode != 0 or not lines:
            failure = (
                failure or f"exited {process.returncode}: {(err.strip() or 'no output')[-300:]}"
            )
            continue
        outputs.append(json.loads(lines[-1]))
    return outputs, failure


def _start(command: list[str]) -> subprocess.Popen[str]:
    pinned = cpu.pinned(command, cpu.LOAD_CORE)
    pipe = subprocess.PIPE
    return subprocess.Popen(pinned, stdout=pipe, stderr=pipe, text=True, cwd=children.ROOT)


def _floors(model: Path, seconds: int) -> Floors:
    """onnxruntime alone on the server core, and the IPC floor across the two cores."""
    _say("lane: floors: onnxruntime alone at batch 1, and bench.ipc's lane design")
    with cpu.on_core(cpu.SERVER_CORE):
        onnx_rate = raw.rows_per_second(servers.newest_onnx(model), 1, seconds)
    layout, request = ipc.Layout(IPC_PAYLOAD), bytes(range(IPC_PAYLOAD))
    cores = (cpu.SERVER_CORE, cpu.LOAD_CORE)
    rates = []
    for transport in (ipc.LaneTransport(), ipc.SpinningLaneTransport()):
        row = ipc.run(transport, layout, request, seconds, cores)
        client = row.client
        rates.append(None if isinstance(client, ipc.Failed) else client.calls / client.wall_s)
    return Floors(onnx_rate, rates[0], rates[1])


def _env_alone(seconds: int) -> float | None:
    """Env steps/s of the rollout worker's vector env of ENVS CartPoles, random actions, no
    server, on the load core."""
    _say(f"lane: {ENVS} CartPole envs alone")
    code = (
        "import time, numpy as np\n"
        "from loop.collect import make_envs\n"
        f"envs = make_envs('CartPole-v1', {ENVS}, 'auto')\n"
        "envs.reset(seed=0)\n"
        "rng = np.random.default_rng(0)\n"
        f"actions = rng.integers(0, 2, size=(1000, {ENVS}))\n"
        "steps, start = 0, time.perf_counter()\n"
        f"while time.perf_counter() - start < {seconds}:\n"
        "    envs.step(actions[steps % 1000])\n"
        "    steps += 1\n"
        f"print('{{\"steps_per_s\": %f}}' % (steps * {ENVS} / (time.perf_counter() - start)))\n"
    )
    output, failure = children.measure([sys.executable, "-c", code], cpu.LOAD_CORE, 60)
    if failure is not None:
        _say(f"lane: the env alone failed: {failure}")
        return None
    return float(output["steps_per_s"])


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
