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
grpc.aio echo's. Needs taskset and two cores, as ``python -m bench`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench import cpu
from bench.servers import ROOT, Server, free_port
from serve.frontends.oip.proto import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
METHOD = f"/{SERVICE}/ModelInfer"
STREAM = f"/{SERVICE}/ModelStreamInfer"
MODEL = "cartpole"
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


@dataclass(frozen=True)
class Setup:
    name: str
    command: Callable[[int], list[str]]  # the server's command, given its gRPC port
    streaming: bool = False
    rlserve: bool = False  # ready when /ready answers 200; an echo says "ready" on stdout


@dataclass(frozen=True)
class Row:
    name: str
    calls_per_s: float
    cpu_us_per_call: float


def setups(threads: int) -> list[Setup]:
    me = [sys.executable, "-m", "bench.grpc_floor", "--serve"]
    rlserve = [sys.executable, "-m", "cli", "serve", "--model-repository", str(REPOSITORY)]
    chosen = [
        Setup("grpc.aio echo", lambda port: [*me, "aio", "--port", str(port)]),
        Setup(
            "grpc.aio stream echo",
            lambda port: [*me, "aio", "--port", str(port)],
            streaming=True,
        ),
        Setup(
            f"grpc sync echo ({threads} threads)",
            lambda port: [*me, "sync", "--port", str(port), "--threads", str(threads)],
        ),
    ]
    if importlib.util.find_spec("grpclib") is not None:
        chosen.append(Setup("grpclib echo", lambda port: [*me, "grpclib", "--port", str(port)]))
    else:
        print("bench.grpc_floor: grpclib is not installed: its row is left out", file=sys.stderr)
    return [
        *chosen,
        Setup("rlserve unary", lambda port: [*rlserve, "--grpc-port", str(port)], rlserve=True),
        Setup(
            "rlserve stream",
            lambda port: [*rlserve, "--grpc-port", str(port)],
            streaming=True,
            rlserve=True,
        ),
    ]


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
                calls = int(loader.stdout.readline())
                spent = server.cpu_seconds() - started
            if loader.returncode != 0:
                raise RuntimeError(f"the load client failed ({loader.returncode})")
        finally:
            server.stop()
    return Row(setup.name, calls / seconds, spent / max(calls, 1) * 1e6)


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


def table(rows: list[Row]) -> str:
    floor = rows[0].cpu_us_per_call
    lines = [
        "| server | calls/s | server CPU µs/call | ÷ grpc.aio echo |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.calls_per_s:,.0f} | {row.cpu_us_per_call:.1f} | "
            f"{row.cpu_us_per_call / floor:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.grpc_floor", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    parser.add_argument("--seconds", type=int, default=5, help="measured seconds per server")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight")
    parser.add_argument("--threads", type=int, default=4, help="the sync server's workers")
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
    rows = [measure(setup, args.seconds, args.concurrency) for setup in setups(args.threads)]
    print(table(rows))


if __name__ == "__main__":
    main()
