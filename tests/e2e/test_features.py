"""Online features against a real server and a real ``redis-server``: a request names
entities, the server reads their features (plain Redis hashes, the documented layout) and
answers as it answers the same observations sent inline; missing features take their
defaults or are refused; a key of another type or a value that is no number refuses only
the request that named the entity; a store that is down or slow is a 503 saying which,
never a 504; a view that does not fit the policy's contract keeps the version from
loading, saying why."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from client import PolicyClient, RequestFailed
from tests.e2e.conftest import DEMO, export_untrained
from tests.e2e.server import Server, free_port
from tests.export.export_envs import VectorsEnv
from tests.redis_server import RedisServer, running_redis

FEATURES = ["x", "x_dot", "theta", "theta_dot"]
TOKEN = "features-test-token"
OUTPUTS = ["actions", "values", "distribution"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("features-redis"), persistent=False) as server:
        yield server


def view(store: RedisServer, *, features: list[str] = FEATURES, extra: str = "") -> str:
    listed = ", ".join(features)
    return (
        f"features:\n  store: {store.address(2)}\n  entity: cart\n  features: [{listed}]\n"
        f"  timeout_ms: 300\n{extra}"
    )


FEAST_ROWS = np.array(
    [[0.1, 0.0, 0.01, 0.5], [0.2, -0.1, 0.02, 0.4], [-0.15, 0.3, -0.03, -0.2]], np.float32
)
FEAST_REPO = """\
from datetime import timedelta

from feast import Entity, FeatureView, Field, FileSource
from feast.types import Float32

cart = Entity(name="cart", join_keys=["cart_id"])
cart_state = FeatureView(
    name="cart_state",
    entities=[cart],
    ttl=timedelta(days=1),
    schema=[Field(name=n, dtype=Float32) for n in ("x", "x_dot", "theta", "theta_dot")],
    source=FileSource(path="carts.parquet", timestamp_field="event_timestamp"),
)
"""


@pytest.fixture(scope="module")
def feast_repository(store: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Feast feature repository: Redis as its online store (db 4), a local parquet
    file as its source, applied and materialized with Feast's own CLI."""
    import pandas as pd

    repo = tmp_path_factory.mktemp("feast")
    (repo / "feature_store.yaml").write_text(
        "project: carts\nregistry: registry.db\nprovider: local\nonline_store:\n"
        f"  type: redis\n  connection_string: '127.0.0.1:{store.port},db=4'\n"
        "entity_key_serialization_version: 3\n"
    )
    (repo / "carts.py").write_text(FEAST_REPO)
    written = datetime.now(UTC) - timedelta(minutes=5)
    frame = pd.DataFrame(FEAST_ROWS, columns=FEATURES).assign(
        cart_id=[1, 2, 3], event_timestamp=[written] * 3
    )
    frame.to_parquet(repo / "carts.parquet")
    feast = Path(sys.executable).parent / "feast"
    until = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    for command in (["apply"], ["materialize-incremental", until]):
        done = subprocess.run(
            [str(feast), *command], cwd=repo, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return repo


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the model repository the server watches."""
    return tmp_path_factory.mktemp("features")


@pytest.fixture(scope="module")
def server(
    store: RedisServer, feast_repository: Path, grpc_port: int, served: Path
) -> Iterator[Server]:
    """carts (a view with a default for theta_dot), strict (no defaults), feast_carts (the
    Feast repository's view), plain (no view), vectors (a Dict space of two float vectors,
    its view by observation key), reviewed (a view, and a repository watched for new
    versions)."""
    tmp = served
    repo = tmp / "repository"
    export_untrained(tmp, repo, "vectors", VectorsEnv(), [16])
    (repo / "vectors" / "config.yaml").write_text(
        f"features:\n  store: {store.address(2)}\n  entity: robot\n  timeout_ms: 300\n"
        "  features:\n    body: [bx, by, bz]\n    goal: [gx, gy]\n"
    )
    feast_features = ", ".join(f"cart_state:{f}" for f in FEATURES)
    configs = {
        "carts": view(store, extra="  defaults: {theta_dot: 0.25}\n  overridable: [theta_dot]\n"),
        "strict": view(store),
        "swapped": view(store),
        "reviewed": view(store),
        "packed": view(store, extra="  layout: float32\n  key_prefix: 'packed:'\n"),
        "feast_carts": (
            f"features:\n  store: feast://{feast_repository}\n  entity: cart_id\n"
            f"  features: [{feast_features}]\n  timeout_ms: 500\n"
        ),
        "plain": None,
    }
    for name, config in configs.items():
        shutil.copytree(DEMO, repo / name)
        if config is not None:
            (repo / name / "config.yaml").write_text(config)
    running = Server.rlserve(
        repo, "--grpc-port", str(grpc_port), "--poll-interval-s", "0.5",
        env={"RLSERVE_ADMIN_TOKEN": TOKEN}, log=tmp / "log",
    )  # fmt: skip
    running.wait_ready()
    yield running
    running.stop()


def stored(store: RedisServer, entity: str | int, values: dict[str, float]) -> None:
    import redis

    with redis.Redis.from_url(store.address(2)) as client:
        client.delete(f"cart:{entity}")
        client.hset(f"cart:{entity}", mapping=values)


def predict(client: httpx.Client, model: str, body: dict[str, Any]) -> httpx.Response:
    return client.post(f"/v1/models/{model}/predict", json=body)


def test_answers_by_entity_equal_answers_to_the_same_observations(
    store: RedisServer, server: Server
) -> None:
    rng = np.random.default_rng(0)
    rows = rng.uniform(-0.2, 0.2, (5, 4)).astype(np.float32)
    for index, row in enumerate(rows):
        stored(store, index, dict(zip(FEATURES, map(float, row), strict=True)))
    with server.client() as client:
        batch = predict(client, "carts", {"entities": list(range(5)), "outputs": OUTPUTS})
        inline = predict(client, "carts", {"observations": rows.tolist(), "outputs": OUTPUTS})
        one = predict(client, "carts", {"entities": 3, "outputs": OUTPUTS})
        one_inline = predict(
            client, "carts", {"observations": rows[3].tolist(), "outputs": OUTPUTS}
        )
    assert batch.status_code == 200, batch.text
    for key in ("actions", "values"):
        np.testing.assert_allclose(batch.json()[key], inline.json()[key], rtol=1e-6)
        np.testing.assert_allclose(one.json()[key], one_inline.json()[key], rtol=1e-6)
    assert np.ndim(one.json()["actions"]) == 0  # one entity: no batch axis
    assert batch.headers["x-policy-version"] == "1"


def test_a_float32_layout_reads_packed_vectors(store: RedisServer, server: Server) -> None:
    import redis

    rows = np.array([[0.05, -0.1, 0.02, 0.3], [0.0, 0.2, -0.04, -0.1]], np.float32)
    with redis.Redis.from_url(store.address(2)) as client:
        client.set("packed:1", rows[0].astype("<f4").tobytes())
        client.set("packed:2", rows[1].astype("<f4").tobytes())
        client.set("packed:3", b"\x00" * 12)  # three floats for a four-value observation
    with server.client() as client:
        by_entity = predict(client, "packed", {"entities": [1, 2], "outputs": ["values"]})
        inline = predict(client, "packed", {"observations": rows.tolist(), "outputs": ["values"]})
        short = predict(client, "packed", {"entities": 3})
    assert by_entity.status_code == 200, by_entity.text
    np.testing.assert_allclose(by_entity.json()["values"], inline.json()["values"], rtol=1e-6)
    assert short.status_code == 422  # a value of the wrong length is no vector: refused
    assert short.json()["error"]["message"].startswith(
        "entities: the feature store holds 12 bytes for entity 3 (key 'packed:3'), not the "
        "view's 4 float32 values (16 bytes"
    )


def test_a_feast_view_answers_by_entity_as_the_same_observations_inline(server: Server) -> None:
    with server.client() as client:
        by_entity = predict(client, "feast_carts", {"entities": [1, 2, 3], "outputs": OUTPUTS})
        inline = predict(
            client, "feast_carts", {"observations": FEAST_ROWS.tolist(), "outputs": OUTPUTS}
        )
        unknown = predict(client, "feast_carts", {"entities": [1, 99]})
    assert by_entity.status_code == 200, by_entity.text
    assert by_entity.json()["actions"] == inline.json()["actions"]
    np.testing.assert_allclose(by_entity.json()["values"], inline.json()["values"], rtol=1e-6)
    assert unknown.status_code == 422
    assert "holds no 'cart_state:x' for entity 99" in unknown.json()["error"]["message"]


def test_v2_and_grpc_take_entities_as_an_int64_input_or_a_parameter(
    store: RedisServer, server: Server, grpc_port: int
) -> None:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    rows = np.array([[0.02, 0.0, -0.01, 0.1], [-0.03, 0.1, 0.02, -0.2]], np.float32)
    for entity, row in zip((11, 12), rows, strict=True):
        stored(store, entity, dict(zip(FEATURES, map(float, row), strict=True)))
    with server.client() as client:
        inline = predict(client, "strict", {"observations": rows.tolist(), "outputs": ["values"]})
    expected = np.asarray(inline.json()["values"], np.float32)
    http = triton_http.InferenceServerClient(f"127.0.0.1:{server.port}")
    numbers = triton_http.InferInput("entities", [2], "INT64")
    numbers.set_data_from_numpy(np.array([11, 12], np.int64))
    by_rest = http.infer("strict", [numbers], outputs=[triton_http.InferRequestedOutput("values")])
    np.testing.assert_allclose(by_rest.as_numpy("values"), expected, rtol=1e-6)
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    numbered = triton_grpc.InferInput("entities", [1], "INT64")
    numbered.set_data_from_numpy(np.array([11], np.int64))
    by_number = grpc.infer(
        "strict", [numbered], outputs=[triton_grpc.InferRequestedOutput("values")]
    )
    np.testing.assert_allclose(by_number.as_numpy("values"), expected[:1], rtol=1e-6)
    stored(store, "named", dict(zip(FEATURES, map(float, rows[1]), strict=True)))
    with server.client() as client:  # string ids: the parameter entities
        body = {
            "parameters": {"entities": ["named"]},
            "inputs": [],
            "outputs": [{"name": "values"}],
        }
        by_parameter = client.post("/v2/models/strict/infer", json=body)
    assert by_parameter.status_code == 200, by_parameter.text
    (values,) = by_parameter.json()["outputs"]
    np.testing.assert_allclose(values["data"], expected[1:], rtol=1e-6)
    one = grpc.infer(
        "strict", [], outputs=[triton_grpc.InferRequestedOutput("values")],
        parameters={"entities": "named"},
    )  # fmt: skip
    np.testing.assert_allclose(one.as_numpy("values"), expected[1:], rtol=1e-6)
    plain = triton_http.InferInput("entities", [1], "INT64")
    plain.set_data_from_numpy(np.array([11], np.int64))
    with pytest.raises(Exception, match="has no features view"):
        http.infer("plain", [plain])


def test_v2_and_grpc_take_entities_as_a_bytes_input(
    store: RedisServer, server: Server, grpc_port: int
) -> None:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    rows = np.array([[0.04, 0.1, -0.02, 0.3], [-0.01, -0.2, 0.03, 0.1]], np.float32)
    names = np.array([b"p-1", "pläyer 2".encode()], dtype=object)
    for entity, row in zip(names, rows, strict=True):
        stored(store, entity.decode(), dict(zip(FEATURES, map(float, row), strict=True)))
    with server.client() as client:
        inline = predict(client, "strict", {"observations": rows.tolist(), "outputs": ["values"]})
    expected = np.asarray(inline.json()["values"], np.float32)
    http = triton_http.InferenceServerClient(f"127.0.0.1:{server.port}")
    for binary in (True, False):
        ids = triton_http.InferInput("entities", [2], "BYTES")
        ids.set_data_from_numpy(names, binary_data=binary)
        answer = http.infer("strict", [ids], outputs=[triton_http.InferRequestedOutput("values")])
        np.testing.assert_allclose(answer.as_numpy("values"), expected, rtol=1e-6)
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    given = triton_grpc.InferInput("entities", [2], "BYTES")
    given.set_data_from_numpy(names)
    by_grpc = grpc.infer("strict", [given], outputs=[triton_grpc.InferRequestedOutput("values")])
    np.testing.assert_allclose(by_grpc.as_numpy("values"), expected, rtol=1e-6)
    observations = triton_http.InferInput("obs", [1, 4], "BYTES")
    observations.set_data_from_numpy(np.array([[b"a", b"b", b"c", b"d"]], dtype=object))
    with pytest.raises(Exception, match="datatype BYTES is not what this model takes; send FP32"):
        http.infer("strict", [observations])
    garbled = triton_http.InferInput("entities", [1], "BYTES")
    garbled.set_data_from_numpy(np.array([b"\xff\xfe"], dtype=object))
    with pytest.raises(Exception, match="element 0 is not UTF-8 text"):
        http.infer("strict", [garbled])


def test_a_view_by_observation_key_builds_a_dict_observation(
    store: RedisServer, server: Server, grpc_port: int
) -> None:
    """The vectors model observes {body: 3 floats, goal: 2 floats}; its view lists each
    key's features. By entity, on every protocol, it answers as the same Dict inline; a
    version over a flat vector does not fit the view and is refused when pushed."""
    import redis
    import tritonclient.grpc as triton_grpc

    robots = {"r1": ([0.5, -1.0, 2.0], [1.0, 0.5]), "r2": ([-0.2, 0.3, 0.0], [-1.5, 2.5])}
    with redis.Redis.from_url(store.address(2)) as client:
        for robot, (body, goal) in robots.items():
            values = dict(zip(["bx", "by", "bz", "gx", "gy"], [*body, *goal], strict=True))
            client.hset(f"robot:{robot}", mapping=values)
    inline_body = {
        "observations": {
            "body": [robots["r1"][0], robots["r2"][0]],
            "goal": [robots["r1"][1], robots["r2"][1]],
        },
        "outputs": ["actions", "values"],
    }
    with server.client() as client:
        inline = predict(client, "vectors", inline_body)
        by_entity = predict(
            client,
            "vectors",
            {"entities": ["r1", "r2"], "outputs": ["actions", "values"], "return_features": True},
        )
        one = predict(client, "vectors", {"entities": "r2", "outputs": ["values"]})
    assert inline.status_code == 200, inline.text
    assert by_entity.status_code == 200, by_entity.text
    np.testing.assert_allclose(by_entity.json()["actions"], inline.json()["actions"], rtol=1e-6)
    assert by_entity.json()["values"] == pytest.approx(inline.json()["values"], rel=1e-6)
    assert by_entity.json()["features"]["gy"] == pytest.approx([0.5, 2.5])
    assert one.json()["values"] == pytest.approx(inline.json()["values"][1], rel=1e-6)
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    ids = triton_grpc.InferInput("entities", [2], "BYTES")
    ids.set_data_from_numpy(np.array([b"r1", b"r2"], dtype=object))
    answer = grpc.infer("vectors", [ids], outputs=[triton_grpc.InferRequestedOutput("values")])
    np.testing.assert_allclose(answer.as_numpy("values"), inline.json()["values"], rtol=1e-6)
    with (
        PolicyClient(server.url, admin_token=TOKEN) as admin,
        pytest.raises(RequestFailed) as refused,
    ):
        admin.push("vectors", 2, DEMO / "1" / "model.onnx")
    assert "lists features by observation key (['body', 'goal'])" in refused.value.message


def test_a_request_may_give_overridable_features_and_see_the_values_used(
    store: RedisServer, server: Server
) -> None:
    stored(store, "over", {"x": 0.05, "x_dot": 0.1, "theta": -0.02, "theta_dot": 0.4})
    with server.client() as client:
        body = {"entities": ["over"], "features": {"theta_dot": -0.3}, "return_features": True}
        given = predict(client, "carts", {**body, "outputs": ["values"]})
        inline = predict(
            client, "carts", {"observations": [[0.05, 0.1, -0.02, -0.3]], "outputs": ["values"]}
        )
        one = predict(client, "carts", {"entities": "over", "return_features": True})
        refused = predict(client, "carts", {"entities": "over", "features": {"x": 1.0}})
        alone = predict(client, "carts", {"observations": [0, 0, 0, 0], "return_features": True})
    assert given.status_code == 200, given.text
    assert given.json()["values"] == pytest.approx(inline.json()["values"], rel=1e-6)
    used = given.json()["features"]
    assert used["theta_dot"] == pytest.approx([-0.3])
    assert used["x"] == pytest.approx([0.05])
    assert one.json()["features"]["theta_dot"] == pytest.approx(0.4)  # one entity: scalars
    assert refused.status_code == 422
    assert "'x' may not be given by a request" in refused.json()["error"]["message"]
    assert alone.status_code == 422
    assert "only with entities" in alone.json()["error"]["message"]


def test_a_live_update_answers_by_entity_and_a_version_that_does_not_fit_is_refused(
    store: RedisServer, server: Server, repository: Path
) -> None:
    """Version 2 (other weights) takes over the view's entities; version 3 (Pendulum's
    three observations for four features) is refused when it is pushed, naming why."""
    row = [0.03, -0.05, 0.01, 0.2]
    stored(store, "swap", dict(zip(FEATURES, row, strict=True)))
    with PolicyClient(server.url, admin_token=TOKEN) as admin:
        admin.push("swapped", 2, repository / "heavy" / "1" / "model.onnx")
        with pytest.raises(RequestFailed) as refused:
            admin.push("swapped", 3, repository / "pendulum" / "1" / "model.onnx")
    with server.client() as client:
        by_entity = predict(client, "swapped", {"entities": "swap", "outputs": ["values"]})
        inline = predict(client, "swapped", {"observations": row, "outputs": ["values"]})
    assert by_entity.json()["model_version"] == 2
    assert by_entity.json()["values"] == pytest.approx(inline.json()["values"], rel=1e-6)
    assert "the features view lists 4 features" in refused.value.message
    assert "observation has 3 values" in refused.value.message


def test_a_version_with_a_view_of_its_own_takes_over_and_runs_its_rows_itself(
    store: RedisServer, server: Server, served: Path
) -> None:
    """reviewed/2 observes the same four values, the last of them another feature (spin,
    not theta_dot): its features.yaml says so. Once the watcher activates it, requests by
    entity are assembled by its view and answered by it."""
    stored(store, "rev", {"x": 0.02, "x_dot": 0.1, "theta": -0.03, "theta_dot": 9.0, "spin": 0.4})
    with server.client() as client:
        before = predict(client, "reviewed", {"entities": "rev", "return_features": True})
    assert before.json()["features"]["theta_dot"] == pytest.approx(9.0)
    staged = served / "repository" / "reviewed" / ".2"
    staged.mkdir()
    shutil.copy(DEMO / "1" / "model.onnx", staged / "model.onnx")
    (staged / "features.yaml").write_text(
        f"store: {store.address(2)}\nentity: cart\nfeatures: [x, x_dot, theta, spin]\n"
        "timeout_ms: 300\n"
    )
    staged.rename(staged.parent / "2")

    def activated(client: httpx.Client) -> bool:
        return bool(client.get("/v1/models/reviewed").json().get("active_version") == 2)

    server.wait_until(activated, 60, "reviewed/2 active")
    with server.client() as client:
        after = predict(
            client, "reviewed", {"entities": "rev", "return_features": True, "outputs": ["values"]}
        )
        inline = predict(
            client, "reviewed", {"observations": [0.02, 0.1, -0.03, 0.4], "outputs": ["values"]}
        )
    assert after.status_code == 200, after.text
    assert after.json()["model_version"] == 2
    assert after.json()["features"] == pytest.approx(
        {"x": 0.02, "x_dot": 0.1, "theta": -0.03, "spin": 0.4}
    )
    assert after.json()["values"] == pytest.approx(inline.json()["values"], rel=1e-6)


def test_a_missing_feature_takes_its_default_or_is_refused_naming_it(
    store: RedisServer, server: Server
) -> None:
    stored(store, "no-spin", {"x": 0.1, "x_dot": 0.0, "theta": 0.05})
    with server.client() as client:
        defaulted = predict(client, "carts", {"entities": "no-spin", "outputs": ["values"]})
        inline = predict(
            client, "carts", {"observations": [0.1, 0.0, 0.05, 0.25], "outputs": ["values"]}
        )
        refused = predict(client, "strict", {"entities": ["no-spin"]})
        unknown = predict(client, "strict", {"entities": [7, "nobody"]})
        metrics = client.get("/metrics").text
    assert defaulted.status_code == 200, defaulted.text
    assert defaulted.json()["values"] == pytest.approx(inline.json()["values"], rel=1e-6)
    assert refused.status_code == 422
    message = refused.json()["error"]["message"]
    assert "entities[0]: the feature store holds no 'theta_dot' for entity \"no-spin\"" in message
    assert "key 'cart:no-spin'" in message
    assert unknown.status_code == 422  # an entity the store has nothing for
    assert "holds no 'x' for entity 7 (key 'cart:7')" in unknown.json()["error"]["message"]
    assert 'rlserve_feature_misses_total{feature="theta_dot",model="carts"}' in metrics


def test_store_down_or_slow_is_a_503_with_retry_after_and_it_recovers(
    store: RedisServer, server: Server
) -> None:
    stored(store, "steady", dict.fromkeys(FEATURES, 0.0))
    with server.client() as client:
        assert predict(client, "carts", {"entities": "steady"}).status_code == 200
        import redis

        with redis.Redis.from_url(store.address(2)) as admin:
            admin.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        slow = predict(client, "carts", {"entities": "steady"})
        inline = predict(client, "carts", {"observations": [0.0, 0.0, 0.0, 0.0]})
        assert slow.status_code == 503, slow.text
        assert slow.headers["retry-after"] == "1"
        assert "did not answer within 300 ms" in slow.json()["error"]["message"]
        assert inline.status_code == 200  # the store holds up nothing else
        store.stop()
        try:
            down = predict(client, "carts", {"entities": "steady"})  # its connection drops
            refused = predict(client, "carts", {"entities": "steady"})  # connecting again
        finally:
            store.start()
        for answer in (down, refused):
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "1"
            assert "failed: ConnectionError: " in answer.json()["error"]["message"]
        assert "Connection refused" in refused.json()["error"]["message"]
        stored(store, "steady", dict.fromkeys(FEATURES, 0.0))
        back = predict(client, "carts", {"entities": "steady"})
        assert back.status_code == 200, back.text


def test_a_wrong_typed_key_or_a_bad_value_fails_only_the_request_that_named_it(
    store: RedisServer, server: Server
) -> None:
    """Issue 41: with ``SET cart:9 "x"``, while one client asked for entity 9, most other
    clients' requests sharing its round trip were answered 503 ("did not answer within
    1e+03 ms"). Now entity 9's requests are 422, saying what its key holds, and every
    other request is served; a value stored as ``1_0`` (``float`` reads 10.0) is refused
    too, even for a feature with a default."""
    import redis

    for index in range(16):
        stored(store, f"ok{index}", dict.fromkeys(FEATURES, 0.01 * index))
    stored(store, "under", dict.fromkeys(FEATURES, 0.0))
    with redis.Redis.from_url(store.address(2)) as admin:
        admin.hset("cart:under", "theta_dot", "1_0")  # float("1_0") is 10.0; JSON: no number
        admin.delete("cart:9")
        admin.set("cart:9", "x")
    try:
        with server.client() as client:
            before = server.metric(client, "rlserve_feature_store_round_trips_total")

            def asking(worker: int) -> list[tuple[str | int, int, str]]:
                answers = []
                with server.client() as own:
                    for turn in range(24):
                        entity: str | int = 9 if turn % 6 == worker % 6 else f"ok{worker}"
                        answer = predict(own, "carts", {"entities": entity})
                        message = answer.json().get("error", {}).get("message", "")
                        answers.append((entity, answer.status_code, message))
                return answers

            with ThreadPoolExecutor(16) as pool:
                answers = [one for some in pool.map(asking, range(16)) for one in some]
            after = server.metric(client, "rlserve_feature_store_round_trips_total")
            both = predict(client, "carts", {"entities": ["ok1", 9]})
            under = predict(client, "carts", {"entities": "under"})
    finally:
        with redis.Redis.from_url(store.address(2)) as admin:
            admin.delete("cart:9")
    assert after - before < len(answers)  # requests shared round trips
    served = [(entity, status, message) for entity, status, message in answers if entity != 9]
    assert served, "no request for a good entity"
    assert all(status == 200 for _, status, _ in served), served[:3]
    refused = {(status, message) for entity, status, message in answers if entity == 9}
    assert refused == {
        (
            422,
            "entities: the feature store holds a string, not a hash, for entity 9 (key "
            "'cart:9'); the view's layout is hash (one field per feature): store the entity's "
            "features with HSET, or read packed vectors with layout: float32",
        )
    }
    assert both.status_code == 422
    assert both.json()["error"]["message"].startswith(
        "entities[1]: the feature store holds a string"
    )
    assert under.status_code == 422, under.text
    assert under.json()["error"]["message"].startswith(
        "entities: the feature store holds 'theta_dot' = '1_0' for entity \"under\" (key "
        "'cart:under'), which is not a number"
    )


def test_concurrent_requests_share_round_trips(store: RedisServer, server: Server) -> None:
    for index in range(64):
        stored(store, f"c{index}", dict.fromkeys(FEATURES, 0.01 * index))
    with server.client() as client:
        before = server.metric(client, "rlserve_feature_store_round_trips_total")

        def one(index: int) -> int:
            with server.client() as own:
                return predict(own, "carts", {"entities": f"c{index}"}).status_code

        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(one, range(64)))
        after = server.metric(client, "rlserve_feature_store_round_trips_total")
    assert statuses == [200] * 64
    assert 1 <= after - before < 64  # requests that wait together share a round trip


def test_a_view_that_does_not_fit_the_contract_keeps_the_version_from_loading(
    store: RedisServer, tmp_path: Path
) -> None:
    repo = tmp_path / "repository"
    shutil.copytree(DEMO, repo / "mismatched")
    (repo / "mismatched" / "config.yaml").write_text(view(store, features=FEATURES[:3]))
    running = Server.rlserve(repo, log=tmp_path / "log")
    try:

        def failed(client: httpx.Client) -> bool:
            answer = client.get("/v1/models/mismatched")
            return answer.status_code == 200 and bool(answer.json()["failed_versions"])

        running.wait_until(failed, 60, "the version refused")
        with running.client() as client:
            reason = client.get("/v1/models/mismatched").json()["failed_versions"][0]["reason"]
            refused = predict(client, "mismatched", {"entities": 1})
    finally:
        running.stop()
    assert "the features view lists 3 features" in reason
    assert "observation has 4 values" in reason
    assert refused.status_code in (404, 503)


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        ("plain", {"entities": 1}, "entities: this model has no features view"),
        ("carts", {"entities": [], "outputs": ["values"]}, "entities: an empty list"),
        ("carts", {"entities": True}, "entities: expected an entity id"),
        (
            "carts",
            {"entities": 1, "observations": [0, 0, 0, 0]},
            "observations, entities: give one",
        ),
    ],
)
def test_bad_entity_requests_are_told_what_to_send(
    server: Server, model: str, body: dict[str, Any], message: str
) -> None:
    with server.client() as client:
        refused = predict(client, model, body)
    assert refused.status_code == 422, refused.text
    assert message in refused.json()["error"]["message"]
