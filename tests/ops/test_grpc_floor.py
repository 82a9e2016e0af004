"""bench/grpc_floor.py's echo answers a real ModelInfer call as rlserve would shape it, and
its load client counts what it gets: the floor the gRPC frontend is measured against is a
working gRPC server, not a stand-in."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc

from bench import grpc_floor, targets
from bench.grpc_floor import Kind
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


def grpc_run(*rows: grpc_floor.Row) -> grpc_floor.GrpcRun:
    return grpc_floor.GrpcRun(
        "2026-12-07 12:00 UTC", 60.0, 5.0, 16, 4, "x86_64", "0.1", "0.2", rows, ()
    )


def test_the_table_divides_each_cost_by_the_unary_and_the_stream_echos() -> None:
    run = grpc_run(
        grpc_floor.Row(Kind.AIO_ECHO, 1000, 200.0),
        grpc_floor.Row(Kind.AIO_STREAM_ECHO, 4000, 50.0),
        grpc_floor.Row(Kind.RLSERVE_UNARY, 500, 500.0),
        grpc_floor.Row(Kind.RLSERVE_STREAM, None, None, "server exited"),
    )
    lines = grpc_floor.table(run)
    assert lines[2] == "| grpc.aio echo | 1,000 | 200.0 | 1.00 | 4.00 |"
    assert lines[4] == "| rlserve unary | 500 | 500.0 | 2.50 | 10.00 |"
    assert lines[5] == "| rlserve stream | failed: server exited | | | |"


def test_the_unary_target_is_met_at_most_1_3_times_the_echo() -> None:
    echo = grpc_floor.Row(Kind.AIO_ECHO, 1000, 200.0)
    met = targets.grpc_verdicts(grpc_run(echo, grpc_floor.Row(Kind.RLSERVE_UNARY, 800, 260.0)))
    assert [(v.met, v.measured) for v in met] == [(True, "1.30x: 260 against 200 µs")]
    missed = targets.grpc_verdicts(grpc_run(echo, grpc_floor.Row(Kind.RLSERVE_UNARY, 500, 400.0)))
    assert [v.met for v in missed] == [False]
    assert missed[0].target.startswith(targets.GRPC_PREFIX)


def test_the_unary_target_says_why_it_was_not_measured() -> None:
    assert [v.measured for v in targets.grpc_verdicts(None)] == ["not run"]
    failed = grpc_run(
        grpc_floor.Row(Kind.AIO_ECHO, 1000, 200.0),
        grpc_floor.Row(Kind.RLSERVE_UNARY, None, None, "server not ready after 120s"),
    )
    assert [(v.met, v.measured) for v in targets.grpc_verdicts(failed)] == [
        (None, "server not ready after 120s")
    ]
