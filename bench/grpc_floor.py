"""gRPC against its floor: what grpcio costs by itself, beside rlserve's ``ModelInfer``.

Each server runs pinned to the server core, and one load client (``grpc.aio``, ``--concurrency``
calls in flight) to the other; a server's cost is its process's CPU time over the measured
seconds, divided by the calls answered. The servers:

- *grpc.aio echo*: grpcio's asyncio server with one generic unary handler that answers a
  fixed, already serialized ``ModelInferResponse`` (raw bytes in and out: no protobuf
  objects, no model): the least a ``ModelInfer`` costs on grpcio's asyncio server, the
  floor rlserve's gRPC frontend is measured against;
- *grpc.aio stream echo*: the same server's ``ModelStreamInfer``, a generic stream handler
  that writes the fixed answer (wrapped as a ``ModelStreamInferResponse``) for each call it
  reads: the floor of rlserve's stream;
- *grpc sync echo*: the same on grpcio's thread-pool server (``--threads`` workers);
- *grpclib echo*: the same on grpclib, a pure-Python asyncio gRPC implementation (skipped
  with one line when it is not installed: ``pip install grpclib``);
- *rlserve unary*: ``rlserve serve --grpc-port`` serving the bundled CartPole policy,
  ``ModelInfer`` with one observation (``raw_input_contents``);
- *rlserve stream*: the same calls on one ``ModelStreamInfer`` stream per client task.

    .venv/bin/python -m bench.grpc_floor [--seconds 5] [--concurrency 16] [--threads 4]

Prints a markdown table: calls/s, the server's CPU µs per call, and that over the
grpc.aio unary and stream echos'. Needs taskset and two cores, as ``python -m bench`` does.
``python -m bench --only grpc`` runs the same (:func:`run`) and writes its section and
target (issue #43: rlserve's unary call ≤ 1.3x the unary echo's CPU) to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench import cpu
from bench.servers import ROOT, Server, free_port
from kernel.errors import one_line
from serve.frontends.oip.proto import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
METHOD = f"/{SERVICE}/ModelInfer"
STREAM = f"/{SERVICE}/ModelStreamInfer"
MODEL = "cartpole"
CONCURRENCY = 16  # calls in flight: one per client task (one stream each when streaming)
THREADS = 4  # the sync echo's workers
MAX_UNARY_OVER_ECHO = 1.3  # issue #43: rlserve's unary ModelInfer, CPU per call
REPOSITORY = ROOT / "examples" / "model_repository"


def request() -> bytes:
    """One CartPole observation as a ``ModelInferRequest``, serialized."""
    call = pb.ModelInferRequest(model_name=MODEL)
    given = call.inputs.add()
    given.name, given.datatype = "obs", "FP32"
    given.shape.extend([1, 4])
    call.raw_input_contents.append(np.array([[0.01, -0.02, 0.03, 0.04]], np.float32).tobytes())
    call.outputs.add().name = "actions"
    return call.SerializeToString()


def answer() -> bytes:
    """What the echo servers answer: a ``ModelInferResponse`` like rlserve's, serialized."""
    response = pb.ModelInferResponse(model_name=MODEL, model_version="1", id="")
    response.parameters["model_sha256"].string_param = "0" * 64
    output = response.outputs.add()
    output.name, output.datatype = "actions", "INT64"
    output.shape.extend([1])
    response.raw_output_contents.append(bytes(8))
    return response.SerializeToString()


# ---------------------------------------------------------------------- the echo servers


def serve_aio(port: int) -> None:
    async def infer(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return fixed

    async def stream_infer(bodies: Any, context: grpc.aio.ServicerContext) -> None:
        async for _ in bodies:
            await context.write(fixed_stream)

    async def main() -> None:
        server = grpc.aio.server()
        handlers = {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(infer),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(stream_infer),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    fixed = answer()
    fixed_stream = pb.ModelStreamInferResponse(
        infer_response=pb.ModelInferResponse.FromString(fixed)
    ).SerializeToString()
    asyncio.run(main())


def serve_sync(port: int, threads: int) -> None:
    fixed = answer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    handler = grpc.unary_unary_rpc_method_handler(lambda body, context: fixed)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def serve_grpclib(port: int) -> None:
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server as GrpclibServer

    fixed = pb.ModelInferResponse.FromString(answer())

    class Echo:
        async def infer(self, stream: object) -> None:
            await stream.recv_message()  # type: ignore[attr-defined]
            await stream.send_message(fixed)  # type: ignore[attr-defined]

        def __mapping__(self) -> dict[str, Handler]:
            kind = Cardinality.UNARY_UNARY
            message = (pb.ModelInferRequest, pb.ModelInferResponse)
            return {METHOD: Handler(self.infer, kind, *message)}

    async def main() -> None:
        server = GrpclibServer([Echo()])
        await server.start("127.0.0.1", port)
        print("ready", flush=True)
        await server.wait_closed()

    asyncio.run(main())


# ---------------------------------------------------------------------- the load


async def load(port: int, seconds: float, concurrency: int, streaming: bool) -> int:
    """Calls answered in ``seconds`` from ``concurrency`` tasks (one stream each when
    ``streaming``), after a warm-up of one second."""
    body = request()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        unary = channel.unary_unary(METHOD)
        stream = channel.stream_stream(STREAM)
        answered = 0

        async def calls(until: float, counted: bool) -> None:
            nonlocal answered
            if streaming:
                call = stream()
                while time.monotonic() < until:
                    await call.write(body)
                    await call.read()
                    answered += counted
                await call.done_writing()
                return
            while time.monotonic() < until:
                await unary(body)
                answered += counted

        await asyncio.gather(*(calls(time.monotonic() + 1, False) for _ in range(concurrency)))
        print("measuring", flush=True)
        until = time.monotonic() + seconds
        await asyncio.gather(*(calls(until, True) for _ in range(concurrency)))
    return answered


# ---------------------------------------------------------------------- the runs


class Kind(Enum):
    """The servers measured, in the table's order (their labels)."""

    AIO_ECHO = "grpc.aio echo"
    AIO_STREAM_ECHO = "grpc.aio stream echo"
    SYNC_ECHO = "grpc sync echo"
    GRPCLIB_ECHO = "grpclib echo"
    RLSERVE_UNARY = "rlserve unary"
    RLSERVE_STREAM = "rlserve stream"


@dataclass(frozen=True)
class Setup:
    kind: Kind
    command: Callable[[int], list[str]]  # the server's command, given its gRPC port
    streaming: bool = False
    rlserve: bool = False  # ready when /ready answers 200; an echo says "ready" on stdout


@dataclass(frozen=True)
class Row:
    kind: Kind
    calls_per_s: float | None  # None: the row failed
    cpu_us_per_call: float | None
    failure: str | None = None


@dataclass(frozen=True)
class GrpcRun:
    """The ``grpc`` scenario of ``python -m bench``: every server's row, in one run."""

    when: str
    seconds: float  # the scenario's wall time
    measured_s: float  # per row
    concurrency: int
    threads: int  # the sync echo's workers
    machine: str
    load_before: str
    load_after: str
    rows: tuple[Row, ...]
    skipped: tuple[str, ...]  # servers left out, and why

    def cost(self, kind: Kind) -> float | None:
        """``kind``'s server CPU µs per call (None: not measured)."""
        costs = (r.cpu_us_per_call for r in self.rows if r.kind is kind and r.cpu_us_per_call)
        return next(costs, None)

    def over(self, kind: Kind, floor: Kind) -> float | None:
        """``kind``'s CPU per call over ``floor``'s (None: either is missing)."""
        mine, theirs = self.cost(kind), self.cost(floor)
        return None if mine is None or theirs is None else mine / theirs


def setups(threads: int) -> tuple[list[Setup], list[str]]:
    """The servers to measure, and those left out (with why)."""
    me = [sys.executable, "-m", "bench.grpc_floor", "--serve"]
    rlserve = [sys.executable, "-m", "cli", "serve", "--model-repository", str(REPOSITORY)]
    chosen = [
        Setup(Kind.AIO_ECHO, lambda port: [*me, "aio", "--port", str(port)]),
        Setup(Kind.AIO_STREAM_ECHO, lambda port: [*me, "aio", "--port", str(port)], streaming=True),
        Setup(
            Kind.SYNC_ECHO,
            lambda port: [*me, "sync", "--port", str(port), "--threads", str(threads)],
        ),
    ]
    skipped = []
    if importlib.util.find_spec("grpclib") is not None:
        chosen.append(Setup(Kind.GRPCLIB_ECHO, lambda port: [*me, "grpclib", "--port", str(port)]))
    else:
        skipped.append("grpclib echo: grpclib is not installed (pip install grpclib)")
    return [
        *chosen,
        Setup(Kind.RLSERVE_UNARY, lambda port: [*rlserve, "--grpc-port", str(port)], rlserve=True),
        Setup(
            Kind.RLSERVE_STREAM,
            lambda port: [*rlserve, "--grpc-port", str(port)],
            streaming=True,
            rlserve=True,
        ),
    ], skipped


def run(seconds: int, concurrency: int = CONCURRENCY, threads: int = THREADS) -> GrpcRun:
    """Every server measured in turn: the scenario ``grpc`` of ``python -m bench``."""
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = cpu.loadavg()
    chosen, skipped = setups(threads)
    rows = []
    for setup in chosen:
        _say(f"grpc: {setup.kind.value}")
        try:
            rows.append(measure(setup, seconds, concurrency))
        except (RuntimeError, TimeoutError) as exc:
            _say(f"grpc: {setup.kind.value} failed: {exc}")
            rows.append(Row(setup.kind, None, None, one_line(exc)))
    return GrpcRun(
        when, time.monotonic() - started, float(seconds), concurrency, threads, cpu.machine(),
        load_before, cpu.loadavg(), tuple(rows), tuple(skipped),
    )  # fmt: skip


def measure(setup: Setup, seconds: int, concurrency: int) -> Row:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-grpc-") as tmp:
        log = Path(tmp) / "server.log"
        server = Server(setup.command(port), {}, log, cpu.SERVER_CORE)
        try:
            if setup.rlserve:
                server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", 120)
            else:
                _wait_said_ready(server, log)
            client = [sys.executable, "-m", "bench.grpc_floor", "--client", "--port", str(port)]
            client += ["--seconds", str(seconds), "--concurrency", str(concurrency)]
            client += ["--streaming"] if setup.streaming else []
            pinned = cpu.pinned(client, cpu.LOAD_CORE)
            with subprocess.Popen(pinned, stdout=subprocess.PIPE, text=True) as loader:
                assert loader.stdout is not None
                loader.stdout.readline()  # "measuring": the warm-up is over
                started = server.cpu_seconds()
                calls = int(loader.stdout.readline() or 0)
                spent = server.cpu_seconds() - started
            if loader.returncode != 0 or not calls:
                raise RuntimeError(f"the load client failed ({loader.returncode})")
        finally:
            server.stop()
    return Row(setup.kind, calls / seconds, spent / calls * 1e6)


def _wait_said_ready(server: Server, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and "ready" in log.read_text():
            return
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited:\n{server.log_tail()}")
        time.sleep(0.05)
    server.stop()
    raise TimeoutError(f"server not ready after {timeout_s:g}s:\n{server.log_tail()}")


def table(run: GrpcRun) -> list[str]:
    """The run's rows as a markdown table: each server's CPU per call over the unary echo's
    and over the stream echo's."""
    lines = [
        "| server | calls/s | server CPU µs/call | ÷ grpc.aio echo | ÷ grpc.aio stream echo |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in run.rows:
        name = row.kind.value
        if row.kind is Kind.SYNC_ECHO:
            name += f" ({run.threads} threads)"
        if row.calls_per_s is None or row.cpu_us_per_call is None:
            lines.append(f"| {name} | failed: {(row.failure or '').replace('|', '/')} | | | |")
            continue
        unary = run.over(row.kind, Kind.AIO_ECHO)
        stream = run.over(row.kind, Kind.AIO_STREAM_ECHO)
        lines.append(
            f"| {name} | {row.calls_per_s:,.0f} | {row.cpu_us_per_call:.1f} | "
            f"{_ratio(unary)} | {_ratio(stream)} |"
        )
    return lines


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.grpc_floor", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--seconds", type=int, default=5, help="measured seconds per server")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="calls in flight")
    parser.add_argument("--threads", type=int, default=THREADS, help="the sync server's workers")
    parser.add_argument("--serve", choices=("aio", "sync", "grpclib"), help=argparse.SUPPRESS)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--streaming", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        {"aio": serve_aio, "sync": lambda p: serve_sync(p, args.threads), "grpclib": serve_grpclib}[
            args.serve
        ](args.port)
        return
    if args.client:
        print(asyncio.run(load(args.port, args.seconds, args.concurrency, args.streaming)))
        return
    cpu.require_cores()
    measured = run(args.seconds, args.concurrency, args.threads)
    print("\n".join(table(measured)))
    for left_out in measured.skipped:
        print(f"left out: {left_out}")


if __name__ == "__main__":
    main()
