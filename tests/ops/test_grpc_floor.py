"""bench/grpc_floor.py's echo answers a real ModelInfer call as rlserve would shape it, and
its load client counts what it gets: the floor the gRPC frontend is measured against is a
working gRPC server, not a stand-in."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc

from bench import grpc_floor
from bench.servers import free_port
from serve.frontends.oip.proto import inference_pb2 as pb


def test_the_request_and_answer_are_the_cartpole_call_rlserve_takes_and_gives() -> None:
    call = pb.ModelInferRequest.FromString(grpc_floor.request())
    assert call.model_name == "cartpole"
    assert [(t.name, t.datatype, list(t.shape)) for t in call.inputs] == [("obs", "FP32", [1, 4])]
    assert len(call.raw_input_contents[0]) == 16
    answer = pb.ModelInferResponse.FromString(grpc_floor.answer())
    assert [(t.name, t.datatype, list(t.shape)) for t in answer.outputs] == [
        ("actions", "INT64", [1])
    ]
    assert answer.parameters["model_sha256"].string_param


def test_the_aio_echo_answers_calls_and_the_client_counts_them() -> None:
    port = free_port()
    command = [sys.executable, "-m", "bench.grpc_floor", "--serve", "aio", "--port", str(port)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as echo:
        assert echo.stdout is not None
        assert echo.stdout.readline().strip() == "ready"
        answered = asyncio.run(grpc_floor.load(port, 1, 2, streaming=False))
        assert answered > 0
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            raw = channel.unary_unary(grpc_floor.METHOD)(grpc_floor.request(), timeout=10)
        assert pb.ModelInferResponse.FromString(raw).model_name == "cartpole"
        echo.terminate()


def test_the_table_divides_every_cost_by_the_first_rows() -> None:
    rows = [grpc_floor.Row("echo", 1000, 200.0), grpc_floor.Row("rlserve", 500, 500.0)]
    lines = grpc_floor.table(rows).splitlines()
    assert lines[2].endswith("| 1.00 |")
    assert lines[3] == "| rlserve | 500 | 500.0 | 2.50 |"
