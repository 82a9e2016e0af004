"""The Open Inference Protocol against a real server, with Triton's own clients.

``tritonclient.http`` (JSON and binary tensor data, both directions) and
``tritonclient.grpc`` (unary and streaming) talk to ``rlserve serve --grpc-port``; answers
are checked against onnxruntime run directly on the same rows, and each failure class is
checked on both transports: unknown model, wrong datatype or shape, deadline, queue full,
draining, a language model (served elsewhere).
"""

from __future__ import annotations

import hashlib
import queue
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from client import PolicyClient
from kernel.distributions import Categorical
from tests.e2e.conftest import LM_MODEL, Exported, lm_repository, only
from tests.e2e.server import Server, free_port

TOKEN = "oip-test-admin-token"
MODELS = ("heavy", "cartpole", "pendulum", "dict")
HEAVY_CONFIG = "max_queue_rows: 1\n"  # heavy: a queue of one row, to see 429s
CARTPOLE_CONFIG = "max_queue_rows: 32768\n"  # room for a call too large to check on the loop


class V2Server:
    """A server with gRPC on, and clients for both transports."""

    def __init__(self, server: Server, grpc_port: int, repository: Path) -> None:
        self.server = server
        self.repository = repository
        self.http_url = server.url.removeprefix("http://")
        self.grpc_url = f"127.0.0.1:{grpc_port}"

    def http(self) -> triton_http.InferenceServerClient:
        return triton_http.InferenceServerClient(self.http_url)

    def grpc(self) -> triton_grpc.InferenceServerClient:
        return triton_grpc.InferenceServerClient(self.grpc_url)

    def onnx(self, model: str) -> ort.InferenceSession:
        return ort.InferenceSession(str(self.repository / model / "1" / "model.onnx"))


def start(repository: Path, tmp: Path, *flags: str) -> tuple[Server, int]:
    grpc_port = free_port()
    server = Server.rlserve(
        repository,
        "--grpc-port",
        str(grpc_port),
        *flags,
        env={"RLSERVE_ADMIN_TOKEN": TOKEN},
        log=tmp / "log",
    )
    server.wait_ready()
    return server, grpc_port


@pytest.fixture(scope="module")
def v2(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Server]:
    tmp = tmp_path_factory.mktemp("oip")
    repo = only(repository, tmp, *MODELS, config=HEAVY_CONFIG)
    (repo / "cartpole" / "config.yaml").write_text(CARTPOLE_CONFIG)
    server, grpc_port = start(repo, tmp)
    yield V2Server(server, grpc_port, repo)
    server.stop()


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.2, 0.2, (n, 4)).astype(np.float32)


def cartpole_expected(v2: V2Server, obs: np.ndarray) -> dict[str, np.ndarray]:
    actions, logits, values = v2.onnx("cartpole").run(["action", "logits", "value"], {"obs": obs})
    log_probs = Categorical(logits).log_prob(actions)
    return {"actions": actions, "logits": logits, "values": values, "log_probs": log_probs}


def assert_matches(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(got) == set(expected)
    for name, values in expected.items():
        if values.dtype.kind in "iu":
            np.testing.assert_array_equal(got[name], values, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], values, rtol=1e-5, atol=1e-6, err_msg=name)


# --------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("binary_in", "binary_out"), [(False, False), (True, True), (True, False), (False, True)]
)
def test_http_answers_equal_onnxruntime_in_json_and_binary(
    v2: V2Server, binary_in: bool, binary_out: bool
) -> None:
    obs = rows(7)
    given = triton_http.InferInput("obs", list(obs.shape), "FP32")
    given.set_data_from_numpy(obs, binary_data=binary_in)
    names = ("actions", "logits", "values", "log_probs")
    wanted = [triton_http.InferRequestedOutput(n, binary_data=binary_out) for n in names]
    with v2.http() as client:
        result = client.infer("cartpole", [given], outputs=wanted, request_id="r-1")
    response = result.get_response()
    assert response["id"] == "r-1"
    assert all(("data" in o) != binary_out for o in response["outputs"])
    assert_matches({n: result.as_numpy(n) for n in names}, cartpole_expected(v2, obs))


def test_grpc_answers_equal_onnxruntime(v2: V2Server) -> None:
    obs = rows(5, seed=1)
    given = triton_grpc.InferInput("obs", list(obs.shape), "FP32")
    given.set_data_from_numpy(obs)
    with v2.grpc() as client:
        result = client.infer("cartpole", [given], request_id="g-1")
    names = ("actions", "logits", "values", "log_probs")
    assert result.get_response().id == "g-1"
    assert_matches({n: result.as_numpy(n) for n in names}, cartpole_expected(v2, obs))


def test_box_actions_and_gaussian_parameters_over_grpc(v2: V2Server) -> None:
    obs = np.random.default_rng(2).uniform(-1, 1, (4, 3)).astype(np.float32)
    given = triton_grpc.InferInput("obs", list(obs.shape), "FP32")
    given.set_data_from_numpy(obs)
    wanted = [triton_grpc.InferRequestedOutput(n) for n in ("actions", "mean", "log_std")]
    with v2.grpc() as client:
        result = client.infer("pendulum", [given], outputs=wanted)
    session = v2.onnx("pendulum")
    names = [o.name for o in session.get_outputs()]
    graph = dict(zip(names, session.run(None, {"obs": obs}), strict=True))
    assert [o.name for o in result.get_response().outputs] == ["actions", "mean", "log_std"]
    np.testing.assert_allclose(result.as_numpy("actions"), graph["action"], rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("mean"), graph["mean"], rtol=1e-6)


def test_dict_observations_are_one_input_per_key(v2: V2Server) -> None:
    with v2.http() as client:
        metadata = client.get_model_metadata("dict")
        given = []
        feeds = {}
        for spec in metadata["inputs"]:
            shape = [3, *spec["shape"][1:]]
            dtype = triton_http_dtype(spec["datatype"])
            data = np.random.default_rng(3).integers(0, 2, shape).astype(dtype)
            tensor = triton_http.InferInput(spec["name"], shape, spec["datatype"])
            tensor.set_data_from_numpy(data)
            given.append(tensor)
            feeds[spec["name"]] = data
        result = client.infer("dict", given, outputs=[triton_http.InferRequestedOutput("actions")])
    expected = v2.onnx("dict").run(["action"], feeds)[0]
    np.testing.assert_array_equal(result.as_numpy("actions"), expected)


def triton_http_dtype(datatype: str) -> Any:
    return {"FP32": np.float32, "UINT8": np.uint8, "INT64": np.int64}[datatype]


def test_stream_answers_every_call_by_its_id(v2: V2Server) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    obs = rows(200, seed=4)
    with v2.grpc() as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for i in range(len(obs)):
            given = triton_grpc.InferInput("obs", [1, 4], "FP32")
            given.set_data_from_numpy(obs[i : i + 1])
            client.async_stream_infer("cartpole", [given], request_id=str(i))
        got = [answers.get(timeout=10) for _ in range(len(obs))]
        client.async_stream_infer("nope", [given], request_id="bad")
        _, error = answers.get(timeout=10)
        client.stop_stream()
    assert all(error is None for _, error in got)
    by_id = {int(r.get_response().id): r.as_numpy("actions")[0] for r, _ in got}
    expected = cartpole_expected(v2, obs)["actions"]
    assert [by_id[i] for i in range(len(obs))] == expected.tolist()
    assert "not_found" in str(error)
    assert "nope" in str(error)


def test_a_stream_answers_a_large_call_beside_small_ones(v2: V2Server) -> None:
    """A call too large to check on the event loop runs in a task of its own while the
    small calls around it take the stream's task-free path: every call is answered once,
    with its own rows' actions."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    large = rows(20_000, seed=6)  # 320 kB of tensors: checked on a worker thread
    small = rows(40, seed=7)
    with v2.grpc() as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for i in range(len(small)):
            if i == len(small) // 2:
                given = triton_grpc.InferInput("obs", list(large.shape), "FP32")
                given.set_data_from_numpy(large)
                client.async_stream_infer("cartpole", [given], request_id="large")
            given = triton_grpc.InferInput("obs", [1, 4], "FP32")
            given.set_data_from_numpy(small[i : i + 1])
            client.async_stream_infer("cartpole", [given], request_id=str(i))
        got = [answers.get(timeout=30) for _ in range(len(small) + 1)]
        client.stop_stream()
    assert [str(error) for _, error in got if error is not None] == []
    by_id = {r.get_response().id: r.as_numpy("actions") for r, _ in got}
    assert by_id.keys() == {"large", *map(str, range(len(small)))}
    np.testing.assert_array_equal(by_id["large"], cartpole_expected(v2, large)["actions"])
    expected = cartpole_expected(v2, small)["actions"]
    assert [int(by_id[str(i)][0]) for i in range(len(small))] == expected.tolist()


def test_answers_are_stamped_with_the_version_and_its_sha256(v2: V2Server) -> None:
    digest = hashlib.sha256((v2.repository / "cartpole" / "1" / "model.onnx").read_bytes())
    given = triton_grpc.InferInput("obs", [1, 4], "FP32")
    given.set_data_from_numpy(rows(1))
    with v2.grpc() as client:
        response = client.infer("cartpole", [given]).get_response()
    assert response.model_version == "1"
    assert response.parameters["model_sha256"].string_param == digest.hexdigest()
    with httpx.Client(base_url=v2.server.url) as client:
        body = {"inputs": [{"name": "obs", "datatype": "FP32", "shape": [1, 4], "data": [0] * 4}]}
        answer = client.post("/v2/models/cartpole/versions/1/infer", json=body)
    assert answer.json()["model_version"] == "1"
    assert answer.json()["parameters"]["model_sha256"] == digest.hexdigest()
    assert answer.headers["x-policy-sha256"] == digest.hexdigest()


def test_seeded_sampling_is_reproducible_over_both_transports(v2: V2Server) -> None:
    obs = np.random.default_rng(5).uniform(-1, 1, (6, 3)).astype(np.float32)
    parameters = {"deterministic": False, "seed": 11}
    http_in = triton_http.InferInput("obs", [6, 3], "FP32")
    http_in.set_data_from_numpy(obs)
    grpc_in = triton_grpc.InferInput("obs", [6, 3], "FP32")
    grpc_in.set_data_from_numpy(obs)
    with v2.http() as h, v2.grpc() as g:
        first = h.infer("pendulum", [http_in], parameters=parameters).as_numpy("actions")
        second = g.infer("pendulum", [grpc_in], parameters=parameters).as_numpy("actions")
        mode = g.infer("pendulum", [grpc_in]).as_numpy("actions")
    np.testing.assert_array_equal(first, second)
    assert not np.allclose(first, mode)


def test_metadata_and_config_describe_the_contract(v2: V2Server) -> None:
    with v2.http() as h, v2.grpc() as g:
        assert h.is_server_live()
        assert h.is_server_ready()
        assert h.is_model_ready("cartpole")
        assert g.is_server_live()
        assert g.is_server_ready()
        assert g.is_model_ready("cartpole")
        assert not g.is_model_ready("nope")
        http_meta = h.get_model_metadata("cartpole")
        grpc_meta = g.get_model_metadata("cartpole", as_json=True)
        config = g.get_model_config("cartpole", as_json=True)["config"]
    assert http_meta["inputs"] == [{"name": "obs", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in http_meta["outputs"]] == ["actions", "log_probs", "values", "logits"]
    assert grpc_meta["inputs"][0]["shape"] == ["-1", "4"]  # int64 as JSON strings
    assert [o["name"] for o in grpc_meta["outputs"]] == [o["name"] for o in http_meta["outputs"]]
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "obs", "data_type": "TYPE_FP32", "dims": ["4"]}]


# --------------------------------------------------------------------------- errors


def http_error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def tensor(module: Any, shape: list[int], datatype: str, dtype: Any) -> Any:
    given = module.InferInput("obs", shape, datatype)
    given.set_data_from_numpy(np.zeros(shape, dtype))
    return given


@pytest.mark.parametrize(
    ("model", "shape", "datatype", "dtype", "status", "code", "words"),
    [
        ("nope", [1, 4], "FP32", np.float32, "404", "NOT_FOUND", "unknown model"),
        ("cartpole", [1, 4], "FP64", np.float64, "422", "INVALID_ARGUMENT", "send FP32"),
        ("cartpole", [1, 3], "FP32", np.float32, "422", "INVALID_ARGUMENT", "[-1, 4]"),
    ],
)
def test_bad_calls_map_to_the_same_status_on_both_transports(
    v2: V2Server,
    model: str,
    shape: list[int],
    datatype: str,
    dtype: Any,
    status: str,
    code: str,
    words: str,
) -> None:
    with v2.http() as h, v2.grpc() as g:
        over_http = http_error(
            lambda: h.infer(model, [tensor(triton_http, shape, datatype, dtype)])
        )
        over_grpc = http_error(
            lambda: g.infer(model, [tensor(triton_grpc, shape, datatype, dtype)])
        )
    assert over_http.status() == status
    assert words in over_http.message()
    assert over_grpc.status() == f"StatusCode.{code}"
    assert words in over_grpc.message()


def test_a_passed_deadline_is_504_and_deadline_exceeded(v2: V2Server) -> None:
    with v2.http() as h, v2.grpc() as g:
        slow_http = http_error(
            lambda: h.infer(
                "cartpole", [tensor(triton_http, [1, 4], "FP32", np.float32)], timeout=1
            )
        )
        slow_grpc = http_error(
            lambda: g.infer(
                "cartpole", [tensor(triton_grpc, [1, 4], "FP32", np.float32)], timeout=1
            )
        )
    assert slow_http.status() == "504"
    assert "deadline" in slow_http.message()
    assert slow_grpc.status() == "StatusCode.DEADLINE_EXCEEDED"


def test_a_full_queue_is_429_and_resource_exhausted(v2: V2Server) -> None:
    """heavy holds one queued row: a burst from both transports finds it full."""
    obs = np.zeros((1, 4), np.float32)
    body = {"inputs": [{"name": "obs", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}]}
    statuses: list[int] = []
    retry_after: list[str | None] = []
    grpc_errors: queue.Queue[Any] = queue.Queue()

    def burst_http() -> None:
        with httpx.Client(base_url=v2.server.url, timeout=10) as client:
            for _ in range(10):
                answer = client.post("/v2/models/heavy/infer", json=body)
                statuses.append(answer.status_code)
                retry_after.append(answer.headers.get("retry-after"))

    with v2.grpc() as g:
        threads = [threading.Thread(target=burst_http) for _ in range(6)]
        for thread in threads:
            thread.start()
        given = triton_grpc.InferInput("obs", [1, 4], "FP32")
        given.set_data_from_numpy(obs)
        for _ in range(60):
            g.async_infer("heavy", [given], callback=lambda result, error: grpc_errors.put(error))
        for thread in threads:
            thread.join()
        errors = [grpc_errors.get(timeout=10) for _ in range(60)]
    assert 429 in statuses
    assert 200 in statuses
    assert all(r is not None for s, r in zip(statuses, retry_after, strict=True) if s == 429)
    codes = {str(e.status()) for e in errors if e is not None}
    assert codes == {"StatusCode.RESOURCE_EXHAUSTED"}
    assert any(e is None for e in errors)


# --------------------------------------------------------------------------- hostile input

OBS_JSON = {"name": "obs", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}


def v2_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text[:500]
    assert response.json()["code"] == code
    return str(response.json()["error"])


def grpc_refusal(v2: V2Server, request: Any) -> grpc.RpcError:
    """The error a ModelInfer call gets, sent with Triton's own stub (the messages here are
    ones its client would not build)."""
    with grpc.insecure_channel(v2.grpc_url) as channel:
        stub = triton_grpc.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=10)
    return caught.value


def grpc_input(name: str, shape: list[int]) -> Any:
    return triton_grpc.service_pb2.ModelInferRequest.InferInputTensor(
        name=name, datatype="FP32", shape=shape
    )


def test_an_integer_header_past_any_length_is_400(v2: V2Server) -> None:
    headers = {"Inference-Header-Content-Length": "1" * 5000}
    with v2.server.client() as client:
        refused = client.post("/v2/models/cartpole/infer", content=b"{}", headers=headers)
    assert "Inference-Header-Content-Length: expected the JSON header's length" in v2_error(
        refused, 400, "malformed_request"
    )
    assert len(refused.content) < 400


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        (
            [("Inference-Header-Content-Length", "{n}"), ("Inference-Header-Content-Length", "3")],
            "Inference-Header-Content-Length is given 2 times",
        ),
        (
            [("Inference-Header-Content-Length", "{n}"), ("Content-Encoding", "gzip")],
            "Content-Encoding 'gzip' is not supported",
        ),
        (
            [("Content-Encoding", "gzip"), ("Inference-Header-Content-Length", "{n}")],
            "Content-Encoding 'gzip' is not supported",
        ),
    ],
    ids=["twice", "encoding-after", "encoding-before"],
)
def test_the_binary_headers_are_checked_whatever_their_order(
    v2: V2Server, headers: list[tuple[str, str]], words: str
) -> None:
    body = orjson.dumps({"inputs": [OBS_JSON]})
    given = [(k, v.format(n=len(body))) for k, v in headers]
    with v2.server.client() as client:
        refused = client.post("/v2/models/cartpole/infer", content=body, headers=given)
    assert words in v2_error(refused, 400, "malformed_request")


@pytest.mark.parametrize("shape", [[0, 2**63 - 1], [2**62, 0, 4]])
def test_dimensions_past_any_request_are_400_and_invalid_argument_on_every_transport(
    v2: V2Server, shape: list[int]
) -> None:
    words = "non-zero dimensions hold more than"
    as_json = {"inputs": [{"name": "obs", "datatype": "FP32", "shape": shape, "data": []}]}
    header = orjson.dumps(
        {"inputs": [{**as_json["inputs"][0], "parameters": {"binary_data_size": 0}}]}
    )
    with v2.server.client() as client:
        over_json = client.post("/v2/models/cartpole/infer", json=as_json)
        over_binary = client.post(
            "/v2/models/cartpole/infer",
            content=header,
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
    assert words in v2_error(over_json, 400, "malformed_request")
    assert words in v2_error(over_binary, 400, "malformed_request")
    request = triton_grpc.service_pb2.ModelInferRequest
    for given in (
        request(model_name="cartpole", inputs=[grpc_input("obs", shape)], raw_input_contents=[b""]),
        request(model_name="cartpole", inputs=[grpc_input("obs", shape)]),
    ):
        refused = grpc_refusal(v2, given)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in str(refused.details())


def test_json_data_must_be_nested_as_its_shape_or_flat(v2: V2Server) -> None:
    def given(data: list[Any]) -> dict[str, Any]:
        return {"inputs": [{"name": "obs", "datatype": "FP32", "shape": [2, 4], "data": data}]}

    with v2.server.client() as client:
        as_4x2 = client.post("/v2/models/cartpole/infer", json=given([[0.0, 0.1]] * 4))
        as_shape = client.post("/v2/models/cartpole/infer", json=given([[0.0] * 4] * 2))
        flat = client.post("/v2/models/cartpole/infer", json=given([0.0] * 8))
    assert "data nested as [4, 2] for shape [2, 4]" in v2_error(as_4x2, 422, "invalid_input")
    assert as_shape.status_code == flat.status_code == 200
    assert as_shape.json()["outputs"] == flat.json()["outputs"]


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models//infer",
        "/v2/models/cartpole/versions//infer",
        "/v2/models/cartpole/infer/",
        "/v2/models/cartpole/",
        "/v2/models/cartpole/versions/1/infer/extra",
    ],
)
def test_paths_that_name_no_route_are_404_naming_the_routes(v2: V2Server, path: str) -> None:
    with v2.server.client() as client:
        for method in ("GET", "POST"):
            refused = client.request(method, path, json={"inputs": [OBS_JSON]})
            message = v2_error(refused, 404, "not_found")
            assert f"{path!r}: not an Open Inference Protocol route" in message
            assert "POST /v2/models/{model}[/versions/{version}]/infer" in message


def test_a_deadline_passed_on_arrival_is_504_on_every_route(v2: V2Server) -> None:
    late = {"X-Request-Timeout-Ms": "0.001"}
    with v2.server.client() as client:
        over_v2 = client.post(
            "/v2/models/cartpole/infer", json={"inputs": [OBS_JSON]}, headers=late
        )
        over_predict = client.post(
            "/v1/models/cartpole/predict", json={"observations": [0.0] * 4}, headers=late
        )
    assert "deadline" in v2_error(over_v2, 504, "deadline_exceeded")
    assert "retry-after" not in over_v2.headers
    assert over_predict.status_code == 504
    assert over_predict.json()["error"]["code"] == "deadline_exceeded"


def test_error_answers_never_echo_unbounded_input_on_either_transport(v2: V2Server) -> None:
    """5,000 inputs: enough to see the list cut, few enough to decode within the deadline
    on a busy machine."""
    long = "a" * 20_000
    many = [
        {"name": f"x{i}", "datatype": "FP32", "shape": [1], "data": [0.0]} for i in range(5_000)
    ]
    with v2.server.client() as client:
        answers = [
            (client.post(f"/v2/models/{long}/infer", json={"inputs": [OBS_JSON]}), 404),
            (client.get(f"/v2/models/cartpole/versions/{long}"), 404),
            (
                client.post(
                    "/v2/models/cartpole/infer", json={"inputs": [{**OBS_JSON, "name": long}]}
                ),
                422,
            ),
            (client.post("/v2/models/cartpole/infer", json={"inputs": [OBS_JSON, *many]}), 422),
            (client.post(f"/v1/models/{long}/predict", json={"observations": [0.0] * 4}), 404),
        ]
    for answer, status in answers:
        assert answer.status_code == status, answer.text[:300]
        assert len(answer.content) < 1000, answer.text[:300]
    assert "(20,000 characters)" in answers[0][0].text
    assert "… and 4,997 more" in answers[3][0].text
    request = triton_grpc.service_pb2.ModelInferRequest
    zeros = np.zeros((1, 4), np.float32).tobytes()
    unknown_model = request(
        model_name=long, inputs=[grpc_input("obs", [1, 4])], raw_input_contents=[zeros]
    )
    many_inputs = request(
        model_name="cartpole",
        inputs=[grpc_input("obs", [1, 4]), *(grpc_input(f"x{i}", [1]) for i in range(5_000))],
        raw_input_contents=[zeros, *([b"\0\0\0\0"] * 5_000)],
    )
    for given, code in [
        (unknown_model, grpc.StatusCode.NOT_FOUND),
        (many_inputs, grpc.StatusCode.INVALID_ARGUMENT),
    ]:
        refused = grpc_refusal(v2, given)
        assert refused.code() == code
        assert len(str(refused.details())) < 1000


def test_hold_makes_the_model_unready_until_resume(v2: V2Server) -> None:
    with PolicyClient(v2.server.url, admin_token=TOKEN) as admin, v2.grpc() as g, v2.http() as h:
        admin.hold("dict")
        try:
            assert not g.is_model_ready("dict")
            assert not h.is_model_ready("dict")
        finally:
            admin.resume("dict")
        assert g.is_model_ready("dict")
        assert h.is_model_ready("dict")


def test_draining_turns_readiness_off_and_stopping_refuses_new_grpc_calls(
    repository: Path, tmp_path: Path
) -> None:
    repo = only(repository, tmp_path, "cartpole")
    server, grpc_port = start(repo, tmp_path, "--drain-delay-s", "2")
    v2 = V2Server(server, grpc_port, repo)
    channel = grpc.insecure_channel(v2.grpc_url)
    health = health_pb2_grpc.HealthStub(channel)
    try:
        with v2.http() as h, v2.grpc() as g:
            assert health.Check(health_pb2.HealthCheckRequest()).status == 1  # SERVING
            server.send_signal(signal.SIGTERM)
            server.wait_until(lambda c: c.get("/v2/health/ready").status_code == 503, 5, "draining")
            assert not g.is_server_ready()
            assert health.Check(health_pb2.HealthCheckRequest()).status == 2  # NOT_SERVING
            given = tensor(triton_grpc, [1, 4], "FP32", np.float32)
            assert g.infer("cartpole", [given]).as_numpy("actions").shape == (1,)  # still served
            assert h.infer("cartpole", [tensor(triton_http, [1, 4], "FP32", np.float32)])
            server.process.wait(15)
            refused = http_error(lambda: g.infer("cartpole", [given]))
        assert refused.status() == "StatusCode.UNAVAILABLE"
    finally:
        channel.close()
        server.stop()


def test_a_language_model_is_refused_on_both_transports_saying_where_it_is_served(
    exported: Exported, tmp_path: Path
) -> None:
    repo = lm_repository(exported, tmp_path, 1)
    server, grpc_port = start(repo, tmp_path)
    v2 = V2Server(server, grpc_port, repo)
    where = f"/v1/models/{LM_MODEL}/generate"
    try:
        with v2.http() as h, v2.grpc() as g:
            refusals = [
                (http_error(lambda: h.get_model_metadata(LM_MODEL)), "422"),
                (http_error(lambda: h.get_model_config(LM_MODEL)), "422"),
                (
                    http_error(
                        lambda: h.infer(LM_MODEL, [tensor(triton_http, [1, 4], "FP32", np.float32)])
                    ),
                    "422",
                ),
                (http_error(lambda: g.get_model_metadata(LM_MODEL)), "StatusCode.INVALID_ARGUMENT"),
                (http_error(lambda: g.get_model_config(LM_MODEL)), "StatusCode.INVALID_ARGUMENT"),
                (
                    http_error(
                        lambda: g.infer(LM_MODEL, [tensor(triton_grpc, [1, 4], "FP32", np.float32)])
                    ),
                    "StatusCode.INVALID_ARGUMENT",
                ),
            ]
            assert not h.is_model_ready(LM_MODEL)
            assert not g.is_model_ready(LM_MODEL)
            indexed = [
                *h.get_model_repository_index(),
                *(
                    {"name": m.name, "state": m.state, "reason": m.reason}
                    for m in g.get_model_repository_index().models
                ),
            ]
        with server.client() as client:  # it is served where the refusal says
            generated = client.post(where, json={"prompt": "The cat", "max_new_tokens": 3})
    finally:
        server.stop()
    for refused, status in refusals:
        assert refused.status() == status
        assert f"model {LM_MODEL!r} is a language model" in refused.message()
        assert where in refused.message()
        assert "/v1/chat/completions" in refused.message()
    assert generated.status_code == 200
    assert len(indexed) == 2  # one version, listed by each transport as not served here
    for entry in indexed:
        assert entry["name"] == LM_MODEL
        assert entry["state"] == "UNAVAILABLE"
        assert where in entry["reason"]
