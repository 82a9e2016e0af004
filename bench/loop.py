"""The inference side of RL training (issue #11): the ``loop`` scenario.

1. **Env steps through the server.** One ``rlserve serve`` process on the server core
   serves the bundled CartPole policy. One rollout worker (``loop.collect.RolloutWorker``,
   CartPole-v1, sampled actions with log-probs and values, no seed) runs in its own
   process on the load core (``python -m bench.loop_child worker``) at each of
   ``NUM_ENVS`` envs per worker, one predict request per iteration for all its envs. It
   publishes every step into a ``memory://`` buffer in its own process, which a drain
   thread of that process empties (poll, commit): the co-located layout's in-process
   queue, so every step reaches a consumer. ``warmup`` seconds of that loop, then
   ``seconds`` measured: env steps/s, requests/s, and the duration of every predict call
   as the worker made it (p50, p99), with the server's CPU time over the same process's
   life per request and per step.
2. **Buffer publish-to-consume latency**, for each backend of ``BACKENDS``: a producer
   publishing batches of ``BATCH`` CartPole-shaped steps at ``RATE`` steps/s and a
   consumer polling and committing like a trainer, both on the load core: two threads of
   one process for ``memory://`` (``python -m bench.loop_child buffer``), two processes
   for the others (``producer`` and ``consumer``, coordinated here). redis-server
   (``appendfsync everysec``) and noida-db (Kafka protocol, 16 partitions) run on the
   server core, started here (bench/brokers.py). Latency per record = the wall clock when
   the poll delivering it returned - the wall clock stamped into its ``served_at`` right
   before ``publish``; p50/p99 over the records published in the measured window. Then
   ``BURST_S`` seconds of back-to-back publishing: end-to-end records/s. A backend that
   cannot start is recorded with the reason and the scenario goes on.

The targets (the issue's goal on this machine and the reference deployment guide's
criteria) are judged in bench/targets.py.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bench import brokers, children, cpu, loop_child, servers
from bench.brokers import Broker, Unavailable
from bench.loop_child import BufferResult, WorkerResult

ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS = (1, 8, 64)
RATE = 2000.0  # steps/s the buffer producer publishes at
BATCH = 64  # steps per publish (a 64-env worker's iteration)
BURST_S = 3.0  # seconds of back-to-back publishing, per backend
CHILD_TIMEOUT_S = 300.0
_CHILD = [sys.executable, "-m", "bench.loop_child"]

# targets (the goal on this machine; the reference deployment guide's criteria)
MIN_STEPS_64 = 40_000.0  # env steps/s, one worker, 64-env requests
MIN_STEPS_1 = 2_000.0  # env steps/s, one worker with one env
MAX_FAST_P99_MS = 5.0  # buffer p99, embedded and Redis
FAST_BACKENDS = ("memory", "file", "redis")
MAX_INFERENCE_P99_MS = 50.0  # reference: inference latency
MIN_FRAMES = 1_000.0  # reference: env frames/s
MAX_BUFFER_MS = 10.0  # reference: buffer latency, every backend


@dataclass(frozen=True)
class Backend:
    key: str  # memory, file, redis, kafka
    label: str


BACKENDS = (
    Backend("memory", "`memory://` (in-process queue)"),
    Backend("file", "`file:///` (append-only local log)"),
    Backend("redis", "`redis://` (Redis Streams, `appendfsync everysec`)"),
    Backend("kafka", "`kafka://` (noida-db, 16 partitions)"),
)


@dataclass(frozen=True)
class WorkerRun:
    num_envs: int
    result: WorkerResult | None
    failure: str | None
    server_cpu_s: float  # over the worker process's whole life (warm-up included)

    @property
    def cpu_us_per_request(self) -> float | None:
        r = self.result
        return self.server_cpu_s * 1e6 / r.all_requests if r and r.all_requests else None

    @property
    def cpu_us_per_step(self) -> float | None:
        r = self.result
        return self.server_cpu_s * 1e6 / r.published if r and r.published else None


@dataclass(frozen=True)
class BufferRun:
    backend: Backend
    server: str  # what served it: "in process", "none (files)", redis-server x.y, noida-db x.y
    result: BufferResult | None
    failure: str | None


@dataclass(frozen=True)
class LoopRun:
    when: str
    seconds: float  # the scenario's wall time
    measured_s: float
    warmup_s: float
    machine: str
    load_before: str  # /proc/loadavg when the scenario started
    load_after: str  # ... and when it ended
    workers: tuple[WorkerRun, ...]
    buffers: tuple[BufferRun, ...]

    def worker(self, num_envs: int) -> WorkerRun | None:
        return next((w for w in self.workers if w.num_envs == num_envs), None)

    def buffer(self, key: str) -> BufferRun | None:
        return next((b for b in self.buffers if b.backend.key == key), None)


def envs(n: int) -> str:
    return f"{n} env" if n == 1 else f"{n} envs"


def run(model: Path, workdir: Path, seconds: int, warmup: int) -> LoopRun:
    """The scenario with the demo CartPole model folder ``model``."""
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = cpu.loadavg()
    workers = _workers(model, workdir, seconds, warmup)
    buffers = tuple(_buffer(b, workdir, seconds) for b in BACKENDS)
    machine = cpu.machine()
    return LoopRun(
        when, time.monotonic() - started, float(seconds), float(warmup), machine, load_before,
        cpu.loadavg(), workers, buffers,
    )  # fmt: skip


# --- 1. env steps through the server ----------------------------------------------------


def _workers(model: Path, workdir: Path, seconds: int, warmup: int) -> tuple[WorkerRun, ...]:
    _say("loop: cartpole: starting rlserve serve")
    server = servers.start(servers.SERVE, model, workdir)
    try:
        return tuple(_worker(server, n, seconds, warmup) for n in NUM_ENVS)
    finally:
        server.stop()


def _worker(server: servers.Server, num_envs: int, seconds: int, warmup: int) -> WorkerRun:
    _say(f"loop: rollout worker, {num_envs} envs")
    command = [
        *_CHILD, "worker", "--url", server.url,
        "--num-envs", str(num_envs), "--seconds", str(seconds), "--warmup", str(warmup),
    ]  # fmt: skip
    before = server.cpu_seconds()
    output, failure = children.measure(command, cpu.LOAD_CORE, CHILD_TIMEOUT_S)
    spent = server.cpu_seconds() - before
    if failure is not None:
        _say(f"loop: worker failed: {failure}")
        print(server.log_tail()[-1500:], file=sys.stderr, flush=True)
        return WorkerRun(num_envs, None, failure, spent)
    return WorkerRun(num_envs, WorkerResult(**output), None, spent)


# --- 2. buffer latency ---------------------------------------------------------------------


def _buffer(backend: Backend, workdir: Path, seconds: int) -> BufferRun:
    _say(f"loop: buffer {backend.key}")
    folder = workdir / f"loop-{backend.key}"
    broker: Broker | None = None
    try:
        if backend.key == "memory":
            server, url = "none: in the process", "memory://bench"
        elif backend.key == "file":
            server, url = "none: files", (folder / "log").as_uri()
        elif backend.key == "redis":
            broker = brokers.redis(folder)
            server = brokers.redis_version()
            url = f"redis://127.0.0.1:{broker.port}/0?stream=rl_experience"
        else:
            broker = brokers.noida(folder)
            server = brokers.noida_version()
            url = f"kafka://127.0.0.1:{broker.port}/rl_experience?partitions=16"
    except Unavailable as exc:
        _say(f"loop: {backend.key} unavailable: {exc}")
        return BufferRun(backend, "", None, f"could not start: {exc}")
    options = [
        "--url", url, "--rate", f"{RATE:g}", "--batch", str(BATCH), "--seconds", str(seconds),
        "--warmup", "1", "--burst", f"{BURST_S:g}",
    ]  # fmt: skip
    try:
        if backend.key == "memory":  # in-process: producer and consumer are threads
            output, failure = children.measure(
                [*_CHILD, "buffer", *options], cpu.LOAD_CORE, CHILD_TIMEOUT_S
            )
            measured = None if failure else BufferResult(**output)
        else:
            log = workdir / f"loop-{backend.key}-children.log"
            measured, failure = _pair(options, log, seconds)
    finally:
        if broker is not None:
            broker.stop()
    if failure is not None:
        _say(f"loop: buffer {backend.key} failed: {failure}")
    return BufferRun(backend, server, measured, failure)


def _pair(options: list[str], log: Path, seconds: int) -> tuple[BufferResult | None, str | None]:
    """A consumer process and a producer process, both on the load core; their merged
    result, or why there is none."""
    with log.open("w") as errors:
        consumer = _start([*_CHILD, "consumer", *options], errors)
        producer = _start([*_CHILD, "producer", *options], errors)
        try:
            return _coordinate(consumer, producer, seconds), None
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            errors.flush()
            lines = [line for line in log.read_text().splitlines() if line.strip()]
            return None, f"{exc}: {(lines or ['no output'])[-1][:300]}"
        finally:
            for process in (producer, consumer):
                if process.poll() is None:
                    process.kill()
                process.wait()


def _start(command: list[str], errors: IO[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cpu.pinned(command, cpu.LOAD_CORE), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=errors, text=True, cwd=ROOT,
    )  # fmt: skip


def _coordinate(
    consumer: subprocess.Popen[str], producer: subprocess.Popen[str], seconds: int
) -> BufferResult:
    """Let the producer go once the consumer has joined; the consumer then stops once it
    has every record the producer says it published."""
    assert consumer.stdin is not None
    assert consumer.stdout is not None
    assert producer.stdin is not None
    ready = _read_line(consumer.stdout, loop_child.JOIN_TIMEOUT_S + 30)
    if ready != loop_child.READY:
        raise RuntimeError(f"the consumer did not join (exit {consumer.poll()})")
    producer.stdin.write("go\n")
    producer.stdin.flush()
    out, _ = producer.communicate(timeout=CHILD_TIMEOUT_S)
    if producer.returncode != 0 or not out.strip():
        consumer.stdin.write("0\n")
        consumer.stdin.flush()
        raise RuntimeError(f"the producer exited {producer.returncode}")
    done = loop_child.Produced(**json.loads(out.strip().splitlines()[-1]))
    out, _ = consumer.communicate(f"{done.total}\n", timeout=CHILD_TIMEOUT_S)
    if consumer.returncode != 0 or not out.strip():
        raise RuntimeError(f"the consumer exited {consumer.returncode}")
    tally = loop_child.Tally(**json.loads(out.strip().splitlines()[-1]))
    return loop_child.result(RATE, BATCH, float(seconds), 2, done, tally)


def _read_line(stream: IO[str], timeout_s: float) -> str:
    """One line from ``stream`` (a child's stdout), "" if none came within ``timeout_s``."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return box[0].strip() if box else ""


# --- children ------------------------------------------------------------------------------


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
