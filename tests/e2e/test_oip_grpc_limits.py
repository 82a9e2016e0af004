"""What one gRPC client can make the server hold or echo, against a real server.

A ``ModelStreamInfer`` stream whose client writes without reading holds at most
``grpc_stream_max_in_flight`` calls in the server: the server stops reading it, grpc's flow
control holds the client's writes back, and the server's memory (VmRSS of its process)
stays where it was. Error statuses fit grpc's metadata limit whatever the input they
describe (a 20 KB model or tensor name, 20,000 unknown inputs), so they keep their own
code instead of turning into ``RESOURCE_EXHAUSTED``. Spoken with the generated stubs of
``serve/frontends/oip/proto``.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from serve.frontends.oip.proto import inference_pb2 as pb
from serve.frontends.oip.proto import inference_pb2_grpc as pb_grpc
from serve.frontends.oip.rpc import STATUS_MESSAGE_BYTES
from tests.e2e.conftest import DEMO
from tests.e2e.server import Server, free_port

Input = pb.ModelInferRequest.InferInputTensor
LONG = 20_000  # characters of a name, or inputs of a call


@dataclass
class GrpcServer:
    server: Server
    address: str

    @property
    def pid(self) -> int:
        return self.server.process.pid


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcServer]:
    """The bundled cartpole policy, with gRPC on and the default stream bound."""
    tmp = tmp_path_factory.mktemp("grpc-limits")
    shutil.copytree(DEMO, tmp / "repository" / "cartpole")
    port = free_port()
    server = Server.rlserve(tmp / "repository", "--grpc-port", str(port), log=tmp / "log")
    server.wait_ready()
    yield GrpcServer(server, f"127.0.0.1:{port}")
    server.stop()


@pytest.fixture
def stub(served: GrpcServer) -> Iterator[Any]:
    with grpc.insecure_channel(served.address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def call(i: int, rows: int, model: str = "cartpole", *, id_bytes: int = 0, **fields: Any) -> Any:
    """Call ``i``; its id is ``i``, padded with dots to ``id_bytes``."""
    obs = np.zeros((rows, 4), np.float32)
    return pb.ModelInferRequest(
        model_name=model,
        id=str(i).ljust(id_bytes, "."),
        inputs=[Input(name="obs", datatype="FP32", shape=[rows, 4])],
        raw_input_contents=[obs.tobytes()],
        **fields,
    )


# --------------------------------------------------------------------------- stream bound


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


class Peak:
    """The highest VmRSS of a process, sampled every 50 ms while in use."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = rss_mib(pid)
        self.peak = self.start
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib(self.pid))

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, rss_mib(self.pid))

    @property
    def growth(self) -> float:
        return self.peak - self.start


@dataclass
class Writer:
    """Up to ``calls`` calls of ``rows`` rows each, written as fast as grpc takes them, until
    ``finish``: the stream's request side, counting what grpc took."""

    calls: int
    rows: int
    id_bytes: int = 0
    sent: int = 0
    finished: threading.Event = field(default_factory=threading.Event)

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.calls):
            if self.finished.is_set():
                return
            self.sent = i + 1
            yield call(i, self.rows, id_bytes=self.id_bytes)

    def finish(self) -> None:
        self.finished.set()

    def wait_held_back(self, still_s: float, timeout_s: float) -> None:
        """Until grpc took nothing more for ``still_s``, all calls are written, or
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        seen, since = self.sent, time.monotonic()
        while time.monotonic() < deadline and self.sent < self.calls:
            time.sleep(0.05)
            if self.sent != seen:
                seen, since = self.sent, time.monotonic()
            elif time.monotonic() - since >= still_s:
                return


def warm_up(stub: Any, rows: int) -> None:
    """A stream read to its end first, so the baseline holds what any first call allocates."""
    answers = list(stub.ModelStreamInfer(iter([call(i, rows) for i in range(200)])))
    assert len(answers) == 200
    assert not any(a.error_message for a in answers)


def answered_ids(answers: Any, count: int, rows: int) -> list[int]:
    ids = []
    for _ in range(count):
        answer = next(answers)
        assert answer.error_message == ""
        assert list(answer.infer_response.outputs[0].shape) == [rows]
        ids.append(int(answer.infer_response.id.rstrip(".")))
    return ids


def test_a_stream_the_client_does_not_read_holds_its_writes_back(
    served: GrpcServer, stub: Any
) -> None:
    """Calls written without reading, each with a 16 kB id (echoed in its answer, so every
    answer the client leaves unread is as large as its call): the server stops reading the
    stream, grpc takes no more from the client, and the server holds a few MiB (had it read
    all, about 1.6 GB). Once read, every call written is answered."""
    writer = Writer(calls=50_000, rows=1, id_bytes=16_000)
    warm_up(stub, 1)
    with Peak(served.pid) as memory:
        answers = stub.ModelStreamInfer(iter(writer))
        writer.wait_held_back(still_s=1.0, timeout_s=10)
        held_back_at = writer.sent
        time.sleep(0.5)  # anything the server still reads would show here
    writer.finish()
    ids = answered_ids(answers, writer.sent, 1)
    assert next(answers, None) is None  # the stream ended with the calls written
    assert held_back_at < writer.calls
    assert memory.growth < 30, f"server RSS grew {memory.growth:.0f} MiB"
    assert sorted(ids) == list(range(writer.sent))


def test_a_stream_of_more_calls_than_its_bound_answers_each_once(stub: Any) -> None:
    """1,000 calls written at once, 64 at most in flight: none is lost or answered twice."""
    answers = list(stub.ModelStreamInfer(iter([call(i, 2) for i in range(1000)])))
    assert sorted(answered_ids(iter(answers), len(answers), 2)) == list(range(1000))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_400000_calls_on_a_stream_not_read_leave_server_memory_within_100_mib(
    served: GrpcServer, stub: Any
) -> None:
    """The issue's measure: a client writing 400,000 one-row calls on one stream, and
    reading nothing until it is held back (or done); then every answer is read."""
    calls = 400_000
    warm_up(stub, 1)
    writer = Writer(calls, 1)
    with Peak(served.pid) as memory:
        answers = stub.ModelStreamInfer(iter(writer))
        writer.wait_held_back(still_s=5.0, timeout_s=120)
        ids = answered_ids(answers, calls, 1)
        assert next(answers, None) is None
    assert memory.growth < 100, f"server RSS grew {memory.growth:.0f} MiB"
    assert sorted(ids) == list(range(calls))


# --------------------------------------------------------------------------- error statuses


def refused(stub: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=30)
    return caught.value


@pytest.mark.parametrize(
    ("what", "request_of", "code", "words"),
    [
        ("a 20 KB model name", lambda: call(0, 1, "m" * LONG), "NOT_FOUND", "unknown model"),
        ("a 20 KB non-ASCII name", lambda: call(0, 1, "é" * LONG), "NOT_FOUND", "unknown model"),
        (
            "a 20 KB tensor name",
            lambda: pb.ModelInferRequest(
                model_name="cartpole",
                inputs=[Input(name="o" * LONG, datatype="FP32", shape=[1, 4])],
                raw_input_contents=[bytes(16)],
            ),
            "INVALID_ARGUMENT",
            "inputs",
        ),
        (
            "a 20 KB non-ASCII input name given twice",
            lambda: pb.ModelInferRequest(
                model_name="cartpole",
                inputs=[Input(name="é" * LONG, datatype="FP32", shape=[1, 4])] * 2,
                raw_input_contents=[bytes(16)] * 2,
            ),
            "INVALID_ARGUMENT",
            "inputs: 'ééé",  # (the rest is cut: the name alone is longer than a status holds)
        ),
        (
            "20,000 unknown inputs",
            lambda: pb.ModelInferRequest(
                model_name="cartpole",
                inputs=[Input(name=f"x{i}", datatype="FP32", shape=[1, 4]) for i in range(LONG)],
                raw_input_contents=[bytes(16)] * LONG,
            ),
            "INVALID_ARGUMENT",
            "unknown",
        ),
    ],
)
def test_an_error_about_a_huge_input_keeps_its_code_with_a_bounded_message(
    stub: Any, what: str, request_of: Any, code: str, words: str
) -> None:
    error = refused(stub, request_of())
    assert error.code() == getattr(grpc.StatusCode, code), (what, error.details()[:200])
    details = error.details()
    assert words in details
    assert len(details.encode()) <= STATUS_MESSAGE_BYTES
    assert dict(error.trailing_metadata())["rlserve-error-code"] in {"not_found", "invalid_input"}


def test_metadata_of_a_20_kb_model_name_is_not_found(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelMetadata(pb.ModelMetadataRequest(name="m" * LONG), timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(caught.value.details().encode()) <= STATUS_MESSAGE_BYTES


def test_a_stream_call_with_a_20_kb_model_name_gets_a_bounded_error_and_the_stream_goes_on(
    stub: Any,
) -> None:
    answers = list(stub.ModelStreamInfer(iter([call(0, 1, "m" * LONG), call(1, 1)])))
    by_id = {a.infer_response.id: a for a in answers}
    assert by_id["0"].error_message.startswith("[not_found]")
    assert len(by_id["0"].error_message.encode()) <= STATUS_MESSAGE_BYTES
    assert by_id["1"].error_message == ""


# --------------------------------------------------------------------------- binary_data_output


@pytest.mark.parametrize(
    ("value", "parameter"),
    [
        (1, pb.InferParameter(int64_param=1)),
        ("true", pb.InferParameter(string_param="true")),
        (0.5, pb.InferParameter(double_param=0.5)),
    ],
)
def test_a_non_boolean_binary_data_output_is_refused_on_both_transports(
    served: GrpcServer, stub: Any, value: Any, parameter: Any
) -> None:
    """(tritonclient sets binary_data_output itself and refuses it as a parameter: the stub.)"""
    error = refused(stub, call(0, 1, parameters={"binary_data_output": parameter}))
    true = pb.InferParameter(bool_param=True)
    accepted = stub.ModelInfer(call(1, 1, parameters={"binary_data_output": true}), timeout=30)
    body = {
        "inputs": [{"name": "obs", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}],
        "parameters": {"binary_data_output": value},
    }
    over_http = httpx.post(f"{served.server.url}/v2/models/cartpole/infer", json=body, timeout=10)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert over_http.status_code == 422
    assert error.details() == over_http.json()["error"]
    assert "binary_data_output: expected true or false" in error.details()
    assert list(accepted.outputs[0].shape) == [1]
