"""The result cache against a real server and a real ``redis-server`` started here: a miss
then a hit (metrics, the header, the same bytes), version swaps that never serve an old
answer, sampled requests that always run the model, TTL expiry, and Redis killed, then
hung, under load while every request is still answered."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest
import redis

from client import PolicyClient
from serve.stores.result_cache import RETRY_AFTER_S
from tests.e2e.conftest import DEMO
from tests.e2e.server import Server
from tests.redis_server import RedisServer, running_redis

TOKEN = "result-cache-test-token"
LOOKUPS = "rlserve_result_cache_lookups_total"
OUTPUTS = ["actions", "distribution", "values"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis"), persistent=False) as server:
        yield server


@pytest.fixture(scope="module")
def other_weights(repository: Path) -> Path:
    """A CartPole policy with other weights than the demo's (the e2e repository's wide
    "heavy" MLP, exported once per session): the version swapped in."""
    return repository / "heavy" / "1" / "model.onnx"


def cartpole_repository(root: Path) -> Path:
    """swap (the demo CartPole; the server's cache), brief (the same, its answers kept
    0.3 s) and uncached (the same, its cache turned off in its config.yaml)."""
    repo = root / "repository"
    for name, config in [
        ("swap", None),
        ("brief", "result_cache_ttl_s: 0.3\n"),
        ("uncached", "result_cache: null\n"),
    ]:
        shutil.copytree(DEMO, repo / name)
        if config is not None:
            (repo / name / "config.yaml").write_text(config)
    return repo


def start(repo: Path, cache: RedisServer, log: Path, timeout_ms: float) -> Server:
    """A server on ``repo`` whose cache is connected (its link connects when a model first
    asks; the requests before that run the model without asking). ``timeout_ms``: how long
    a lookup may take (2 shared cores answer a loopback GET in well under 5 ms, the default,
    but not always while other tests run; a slow answer is an error and a miss)."""
    env = {
        "RLSERVE_ADMIN_TOKEN": TOKEN,
        "RLSERVE_RESULT_CACHE": cache.address(3),
        "RLSERVE_RESULT_CACHE_TIMEOUT_MS": str(timeout_ms),
    }
    running = Server.rlserve(repo, env=env, log=log)
    running.wait_ready()
    warm_up = {"observations": [0.5, 0.5, 0.5, 0.5]}

    def asked(client: httpx.Client) -> bool:
        predict(client, "swap", warm_up)
        counted = lookups(running, client, "swap")
        return counted["miss"] + counted["hit"] > 0

    running.wait_until(asked, 10, "connected to the result cache")
    return running


@pytest.fixture(scope="module")
def server(store: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("server")
    running = start(cartpole_repository(tmp), store, tmp / "log", timeout_ms=250)
    yield running
    running.stop()


_seen = iter(range(1, 1 << 30))


def fresh_observation() -> list[float]:
    """An observation no earlier request sent (its answer is in no cache yet)."""
    return [0.001 * next(_seen), -0.02, 0.03, 0.04]


def predict(client: httpx.Client, model: str, body: dict, version: int | None = None):
    path = f"/v1/models/{model}" + ("" if version is None else f"/versions/{version}")
    response = client.post(path + "/predict", json=body)
    assert response.status_code == 200, response.text
    return response


def offline(model: Path, observation: list[float]) -> dict[str, np.ndarray]:
    """What onnxruntime answers for one observation on the given file."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    values = session.run(None, {"obs": np.asarray([observation], np.float32)})
    return dict(zip(names, values, strict=True))


def lookups(server: Server, client: httpx.Client, model: str) -> dict[str, float]:
    results = ("hit", "miss", "error", "unavailable")
    return {r: server.metric(client, LOOKUPS, model=model, result=r) for r in results}


def cached_keys(store: RedisServer, model: str) -> set[bytes]:
    with redis.Redis(port=store.port, db=3) as raw:
        return set(raw.scan_iter(match=f"rlserve:result:{model}:*".encode()))


def test_a_repeated_request_is_a_miss_then_a_hit_with_the_same_bytes(
    server: Server, store: RedisServer
) -> None:
    observation = fresh_observation()
    with server.client() as client:
        before = lookups(server, client, "swap")
        answered = server.metric(client, "rlserve_requests_total", model="swap", status="200")
        batches = server.metric(client, "rlserve_batch_rows_count", model="swap")
        miss = predict(client, "swap", {"observations": observation, "outputs": OUTPUTS})
        deadline = time.monotonic() + 5
        while not cached_keys(store, "swap") and time.monotonic() < deadline:
            time.sleep(0.005)  # the write is not awaited by the request: it lands just after
        # the same observation written otherwise: another spelling, the outputs reordered
        spelled = b'{"outputs": ["values", "distribution", "actions"], "observations": [%s]}' % (
            ", ".join(f"{v:.6e}" for v in observation).encode()
        )
        hit = client.post("/v1/models/swap/predict", content=spelled)
        after = lookups(server, client, "swap")
        answered_now = server.metric(client, "rlserve_requests_total", model="swap", status="200")
        batches_now = server.metric(client, "rlserve_batch_rows_count", model="swap")
        stored = server.metric(
            client, "rlserve_result_cache_writes_total", model="swap", result="stored"
        )
    assert (miss.headers["X-Result-Cache"], hit.headers["X-Result-Cache"]) == ("miss", "hit")
    assert hit.content == miss.content  # byte for byte: stamps, outputs, key order
    for header in ("X-Policy-Version", "X-Policy-SHA256", "Content-Type"):
        assert hit.headers[header] == miss.headers[header]
    assert hit.headers["X-Request-Id"] != miss.headers["X-Request-Id"]
    assert (after["hit"] - before["hit"], after["miss"] - before["miss"]) == (1, 1)
    assert after["error"] == before["error"] == 0
    assert stored >= 1
    assert answered_now - answered == 2  # a hit is an answered request too
    assert batches_now - batches == 1  # only the miss ran the model
    body = orjson.loads(hit.content)
    expected = offline(DEMO / "1" / "model.onnx", observation)
    assert body["actions"] == int(expected["action"][0])
    np.testing.assert_allclose(body["distribution"]["logits"], expected["logits"][0], atol=1e-5)


def test_a_model_whose_cache_is_off_answers_without_one(server: Server, store: RedisServer) -> None:
    with server.client() as client:
        answers = [
            predict(client, "uncached", {"observations": [0.1, 0.2, 0.3, 0.4]}) for _ in range(2)
        ]
        counted = lookups(server, client, "uncached")
    assert all("X-Result-Cache" not in a.headers for a in answers)
    assert sum(counted.values()) == 0
    assert cached_keys(store, "uncached") == set()


def test_the_open_inference_protocol_is_not_cached(server: Server) -> None:
    body = {"inputs": [{"name": "obs", "datatype": "FP32", "shape": [1, 4], "data": [0.2] * 4}]}
    with server.client() as client:
        before = lookups(server, client, "swap")
        answers = [client.post("/v2/models/swap/infer", json=body) for _ in range(2)]
        after = lookups(server, client, "swap")
    assert [a.status_code for a in answers] == [200, 200]
    assert all("X-Result-Cache" not in a.headers for a in answers)
    assert after == before


def test_sampled_and_seeded_requests_always_run_the_model(
    server: Server, store: RedisServer
) -> None:
    observation = fresh_observation()
    bodies = [
        {"observations": observation, "deterministic": False},
        {"observations": observation, "deterministic": False, "seed": 7},
        {"observations": observation, "seed": 7},
    ]
    keys = cached_keys(store, "swap")
    with server.client() as client:
        before = lookups(server, client, "swap")
        batches = server.metric(client, "rlserve_batch_rows_count", model="swap")
        answers = [predict(client, "swap", body) for body in bodies for _ in range(2)]
        after = lookups(server, client, "swap")
        batches_now = server.metric(client, "rlserve_batch_rows_count", model="swap")
    assert [a.headers["X-Result-Cache"] for a in answers] == ["bypass"] * 6
    assert after == before  # never looked up
    assert batches_now - batches == 6  # each one ran the model
    assert cached_keys(store, "swap") == keys  # and nothing was stored
    assert answers[2].json() == answers[3].json()  # seeded: the same draw, from the model


def wait_cached(store: RedisServer, model: str, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(cached_keys(store, model)) < count and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_version_swap_never_serves_the_old_versions_answer(
    server: Server, store: RedisServer, other_weights: Path
) -> None:
    observation = fresh_observation()
    body = {"observations": observation, "outputs": OUTPUTS}
    held = len(cached_keys(store, "swap"))
    with server.client() as client, PolicyClient(server.url, admin_token=TOKEN) as admin:
        first = predict(client, "swap", body)
        wait_cached(store, "swap", held + 1)
        assert predict(client, "swap", body).headers["X-Result-Cache"] == "hit"

        assert admin.push("swap", 2, other_weights)["result"] == "activated"
        swapped = predict(client, "swap", body)
        wait_cached(store, "swap", held + 2)
        swapped_again = predict(client, "swap", body)
        pinned_old = predict(client, "swap", body, version=1)  # v1 is still resident

        assert admin.rollback("swap")["previous_version"] == 2
        rolled_back = predict(client, "swap", body)

        # the first version's very file, pushed as version 3: the same sha256, another version
        assert admin.push("swap", 3, DEMO / "1" / "model.onnx")["result"] == "activated"
        same_file = predict(client, "swap", body)

    old, new = orjson.loads(first.content), orjson.loads(swapped.content)
    assert (old["model_version"], new["model_version"]) == (1, 2)
    assert swapped.headers["X-Result-Cache"] == "miss"
    expected = offline(other_weights, observation)  # the new version's own answer
    np.testing.assert_allclose(new["distribution"]["logits"], expected["logits"][0], atol=1e-5)
    assert not np.allclose(new["distribution"]["logits"], old["distribution"]["logits"])
    assert new["model_sha256"] != old["model_sha256"]
    assert (swapped_again.headers["X-Result-Cache"], swapped_again.content) == (
        "hit",
        swapped.content,
    )
    # a request naming version 1, and version 1 active again, get version 1's own answer
    assert (pinned_old.headers["X-Result-Cache"], pinned_old.content) == ("hit", first.content)
    assert (rolled_back.headers["X-Result-Cache"], rolled_back.content) == ("hit", first.content)
    third = orjson.loads(same_file.content)
    assert same_file.headers["X-Result-Cache"] == "miss"
    assert (third["model_version"], third["model_sha256"]) == (3, old["model_sha256"])
    assert third["distribution"] == old["distribution"]


def test_a_cached_answer_expires_after_its_ttl(server: Server) -> None:
    body = {"observations": fresh_observation()}
    with server.client() as client:

        def until_hit() -> list[str]:
            """Asks until an answer comes from the cache (its write lands after the answer)."""
            seen = [predict(client, "brief", body).headers["X-Result-Cache"]]
            deadline = time.monotonic() + 5
            while seen[-1] != "hit" and time.monotonic() < deadline:
                seen.append(predict(client, "brief", body).headers["X-Result-Cache"])
            return seen

        first = until_hit()
        time.sleep(0.5)  # brief keeps its answers 0.3 s
        expired = until_hit()
    assert (first[0], first[-1]) == ("miss", "hit")
    assert expired[0] == "miss"  # the answer cached before the sleep is gone ...
    assert expired[-1] == "hit"  # ... and the new one is cached in its place


def test_redis_killed_then_hung_under_load_fails_no_request(tmp_path: Path) -> None:
    store = RedisServer(tmp_path / "redis", persistent=False)
    store.start()
    running = start(cartpole_repository(tmp_path), store, tmp_path / "log", timeout_ms=20)
    observations = [fresh_observation() for _ in range(8)]
    answers: dict[int, bytes] = {}
    failures: list[str] = []
    slowest: list[float] = []
    stop = threading.Event()

    def load(worker: int) -> None:
        rng = np.random.default_rng(worker)
        with running.client() as client:
            while not stop.is_set():
                i = int(rng.integers(len(observations)))
                started = time.monotonic()
                try:
                    response = client.post(
                        "/v1/models/swap/predict", json={"observations": observations[i]}
                    )
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                    continue
                slowest.append(time.monotonic() - started)
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text}")
                elif answers.setdefault(i, response.content) != response.content:
                    failures.append(f"observation {i}: {response.content!r} != {answers[i]!r}")

    try:
        threads = [threading.Thread(target=load, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # every answer cached by now
        with running.client() as client:
            cached = lookups(running, client, "swap")
            store.kill()  # gone: its connections reset, new ones refused
            time.sleep(1.5)
            killed = lookups(running, client, "swap")
            store.start()  # back, empty
            time.sleep(RETRY_AFTER_S + 1.0)
            back = lookups(running, client, "swap")
            assert store.process is not None
            store.process.send_signal(signal.SIGSTOP)  # hung: accepts, never answers
            time.sleep(1.5)
            hung = lookups(running, client, "swap")
            store.process.send_signal(signal.SIGCONT)  # answers again
            time.sleep(1.5)
            recovered = lookups(running, client, "swap")
        stop.set()
        for t in threads:
            t.join()
    finally:
        stop.set()
        running.stop()
        store.stop()

    assert failures == []  # every request answered 200, with the answer it had before
    assert len(slowest) > 100
    assert max(slowest) < 1.0  # no request came near its deadline
    assert cached["hit"] > 0
    assert killed["error"] > cached["error"]  # the round trip that found Redis gone
    assert killed["unavailable"] > cached["unavailable"]  # then not asked while down
    assert back["miss"] > killed["miss"]  # connected again: the new Redis holds nothing yet
    assert back["hit"] > killed["hit"]  # and it fills again
    assert hung["error"] > back["error"]  # a round trip Redis did not answer in time
    assert hung["unavailable"] > back["unavailable"]
    assert recovered["hit"] > hung["hit"]  # connected again once Redis answers
