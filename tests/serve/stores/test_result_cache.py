"""The result cache's key, settings and Redis client, without a server: keys made from the
bundled CartPole version's own validation of real JSON bodies, and lookups and writes against
a real ``redis-server`` started here (``tests/redis_server.py``)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kernel.errors import ConfigError
from serve import config
from serve.control import repository
from serve.dataplane.messages import InferenceRequest, Prepared
from serve.dataplane.model import RowModel, as_rows
from serve.frontends.predict.json_body import PredictBodyDecoder
from serve.metrics import Metrics
from serve.stores.result_cache import (
    KEY_PREFIX,
    CacheSettings,
    ResultCache,
    cache_key,
)
from tests.e2e.server import free_port
from tests.redis_server import RedisServer, running_redis
from tests.serve.inprocess import REPOSITORY

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def cartpole(bounds: str = "allow") -> RowModel:
    """Version 1 of the bundled CartPole policy, loaded as the server loads it."""
    settings = config.load(model_repository=REPOSITORY, observation_bounds=bounds)
    (where,) = repository.discover(REPOSITORY)["cartpole"]
    return as_rows(repository.load_version(where, settings, settings.for_model({})))


@pytest.fixture(scope="module")
def model() -> RowModel:
    return cartpole()


def prepared(model: RowModel, body: bytes) -> Prepared:
    """A raw JSON predict body, decoded and validated as the predict route does it."""
    payload = PredictBodyDecoder(frozenset({"deterministic", "seed", "outputs"})).decode(body)
    inputs: dict[str, Any] = {
        k: payload.pop(k) for k in ("observations", "actions") if k in payload
    }
    return model.prepare(InferenceRequest(inputs, payload, "r", 0.0, float("inf")))


def key(model: RowModel, body: bytes, **stamp: Any) -> bytes | None:
    name, version, sha256 = stamp.get("name", "cartpole"), stamp.get("version", 1), model.sha256
    return cache_key(name, version, stamp.get("sha256", sha256), prepared(model, body))


# ---------------------------------------------------------------------------- the key


def test_one_observation_written_differently_has_one_key(model: RowModel) -> None:
    spellings = [
        b'{"observations": [0.01, -0.02, 0.03, 0.04]}',
        b'{"observations":[1e-2,-2e-2,3.0e-2,0.04]}',
        b'{ "observations" : [ 0.010, -0.0200, 0.03, 4E-2 ] , "deterministic" : true }',
        b'{"outputs": ["actions"], "observations": [0.01, -0.02, 0.03, 0.04]}',
    ]
    keys = {key(model, body) for body in spellings}
    assert len(keys) == 1
    (only,) = keys
    assert only is not None
    assert only.startswith(KEY_PREFIX + b"cartpole:1:" + model.sha256.encode() + b":")
    # outputs are a set: their order changes nothing; integers are the floats they equal
    assert key(model, b'{"observations": [0, 1, 2, 3], "outputs": ["values", "actions"]}') == key(
        model, b'{"observations": [0.0, 1.0, 2e0, 3.0], "outputs": ["actions", "values"]}'
    )


def test_what_changes_the_answer_changes_the_key(model: RowModel) -> None:
    obs = b'{"observations": [0.01, -0.02, 0.03, 0.04]'
    base = key(model, obs + b"}")
    others = [
        key(model, b'{"observations": [0.01, -0.02, 0.03, 0.05]}'),  # another observation
        key(model, b'{"observations": [[0.01, -0.02, 0.03, 0.04]]}'),  # a batch of one
        key(model, obs + b', "outputs": ["actions", "log_probs"]}'),
        key(model, obs + b', "outputs": ["values"]}'),
        key(model, obs + b', "actions": 1, "outputs": ["log_probs"]}'),  # scoring
        key(model, obs + b', "actions": 0, "outputs": ["log_probs"]}'),
        key(model, obs + b"}", version=2),  # the same file served as another version
        key(model, obs + b"}", sha256="0" * 64),  # another file
        key(model, obs + b"}", name="other"),
    ]
    assert base is not None
    assert None not in others
    assert len({base, *others}) == 1 + len(others)


def test_sampled_and_seeded_answers_are_never_keyed(model: RowModel) -> None:
    obs = b'{"observations": [0.01, -0.02, 0.03, 0.04]'
    assert key(model, obs + b', "deterministic": false}') is None
    assert key(model, obs + b', "deterministic": false, "seed": 7}') is None
    assert key(model, obs + b', "seed": 7}') is None


def test_the_key_is_of_the_observation_the_model_sees_after_clipping() -> None:
    inside, outside = b'{"observations": [1, 0, 0, 0]}', b'{"observations": [9, 0, 0, 0]}'
    clipped = cartpole("clip")  # CartPole's cart position is within [-4.8, 4.8]
    at_bound = b'{"observations": [4.8, 0, 0, 0]}'
    assert key(clipped, outside) == key(clipped, at_bound) != key(clipped, inside)
    allowed = cartpole("allow")
    assert key(allowed, outside) != key(allowed, at_bound)


# ---------------------------------------------------------------------------- settings


def test_a_model_sets_its_cache_over_the_server_default(tmp_path: Path) -> None:
    settings = config.load(result_cache="redis://cache:6379/2", result_cache_ttl_s=5)
    assert CacheSettings.of(settings.for_model({})) == CacheSettings(
        "redis://cache:6379/2", 5000, 65536, 0.005
    )
    model_config = tmp_path / "config.yaml"
    model_config.write_text("result_cache: null\n")
    assert CacheSettings.of(settings.for_model(config.load_model_overrides(model_config))) is None
    model_config.write_text("result_cache: unix:///run/redis.sock\nresult_cache_timeout_ms: 2\n")
    own = CacheSettings.of(config.load().for_model(config.load_model_overrides(model_config)))
    assert own == CacheSettings("unix:///run/redis.sock", 60000, 65536, 0.002)
    assert CacheSettings.of(config.load().for_model({})) is None  # off by default


def test_the_cache_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSERVE_RESULT_CACHE", "rediss://cache:6380/0")
    monkeypatch.setenv("RLSERVE_RESULT_CACHE_MAX_ENTRY_BYTES", "100")
    settings = config.load()
    assert (settings.result_cache, settings.result_cache_max_entry_bytes) == (
        "rediss://cache:6380/0",
        100,
    )


def test_a_cache_that_is_not_a_redis_url_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"result_cache: .*expected a Redis URL") as refused:
        config.load(result_cache="http://user:hunter2@cache:6379")
    assert "hunter2" not in str(refused.value)  # a URL may hold a password: never echoed
    with pytest.raises(ConfigError, match="result_cache_ttl_s: Input should be greater than 0"):
        config.load(result_cache_ttl_s=0)
    with pytest.raises(ConfigError, match=r"result_cache: .*expected a Redis URL"):
        config.load().for_model({"result_cache": "localhost:6379"})


def test_a_cache_without_the_redis_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # as if redis-py were not installed
    with pytest.raises(ConfigError, match=r"result_cache: .*pip install 'rlserve\[cache\]'"):
        config.load(result_cache="redis://127.0.0.1:6379/0")


def test_the_server_runs_without_the_redis_client_installed() -> None:
    script = (
        "import sys; sys.modules['redis'] = None\n"  # any import of redis now fails
        "from serve import config\n"
        "from serve.process.app import create_app\n"
        f"create_app(config.load(model_repository={str(REPOSITORY)!r}))\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


# ---------------------------------------------------------------------------- Redis


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis"), persistent=False) as server:
        yield server


def counted(metrics: Metrics, name: str, **labels: str) -> float:
    metrics.flush()
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def lookups(metrics: Metrics, result: str) -> float:
    return counted(metrics, "rlserve_result_cache_lookups_total", model="m", result=result)


def writes(metrics: Metrics, result: str) -> float:
    return counted(metrics, "rlserve_result_cache_writes_total", model="m", result=result)


async def connected(cache: ResultCache, settings: CacheSettings) -> None:
    """Until the cache's link is connected (the first lookup makes it connect: not asked)."""
    assert await cache.lookup("warm-up", settings, b"rlserve:result:warm-up") is None
    deadline = time.monotonic() + 5
    while not cache.connected(settings.url):
        assert time.monotonic() < deadline, "the result cache did not connect in 5 s"
        await asyncio.sleep(0.005)


async def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 5
    while not check():
        assert time.monotonic() < deadline, f"not {what} after 5 s"
        await asyncio.sleep(0.005)


async def test_an_answer_stored_is_found_byte_for_byte_until_it_expires(
    store: RedisServer,
) -> None:
    metrics = Metrics()
    cache = ResultCache(metrics)
    settings = CacheSettings(store.address(), 300, 1024, 0.5)
    await connected(cache, settings)
    answer = b'{"model":"m","model_version":1,"model_sha256":"ab","actions":1}'
    assert await cache.lookup("m", settings, b"rlserve:result:t1") is None
    cache.store("m", settings, b"rlserve:result:t1", answer)
    await until(lambda: writes(metrics, "stored") == 1, "stored")
    assert await cache.lookup("m", settings, b"rlserve:result:t1") == answer
    ttl_ms = redis.Redis(port=store.port).pttl(b"rlserve:result:t1")
    assert 0 < ttl_ms <= 300
    await asyncio.sleep(0.4)
    assert await cache.lookup("m", settings, b"rlserve:result:t1") is None
    assert (lookups(metrics, "hit"), lookups(metrics, "miss")) == (1, 2)
    await cache.close()


async def test_concurrent_lookups_share_round_trips(store: RedisServer) -> None:
    metrics = Metrics()
    cache = ResultCache(metrics)
    settings = CacheSettings(store.address(), 60000, 1024, 0.5)
    await connected(cache, settings)
    keys = [b"rlserve:result:many-%d" % i for i in range(200)]
    for key in keys[::2]:
        cache.store("m", settings, key, b"answer " + key)
    await until(lambda: writes(metrics, "stored") == 100, "stored")
    with redis.Redis(port=store.port) as raw:
        before = raw.info("stats")["total_commands_processed"]
        found = await asyncio.gather(*(cache.lookup("m", settings, key) for key in keys))
        commands = raw.info("stats")["total_commands_processed"] - before - 1  # this INFO
    assert found == [b"answer " + k if i % 2 == 0 else None for i, k in enumerate(keys)]
    assert commands < 10  # 200 lookups in a few MGETs
    await cache.close()


async def test_an_answer_over_the_entry_bound_is_not_stored(store: RedisServer) -> None:
    metrics = Metrics()
    cache = ResultCache(metrics)
    settings = CacheSettings(store.address(), 60000, 10, 0.5)
    await connected(cache, settings)
    cache.store("m", settings, b"rlserve:result:t2", b"x" * 11)
    cache.store("m", settings, b"rlserve:result:t2-small", b"x" * 10)
    await until(lambda: writes(metrics, "stored") == 1, "stored")
    assert redis.Redis(port=store.port).exists(b"rlserve:result:t2") == 0
    assert writes(metrics, "too_large") == 1
    await cache.close()


async def test_redis_gone_is_counted_then_left_alone_then_connected_again(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path, persistent=False)
    server.start()
    metrics = Metrics()
    cache = ResultCache(metrics)
    settings = CacheSettings(server.address(), 60000, 1024, 0.05)
    await connected(cache, settings)
    server.kill()
    started = time.monotonic()
    for _ in range(3):
        assert await cache.lookup("m", settings, b"rlserve:result:t3") is None
    cache.store("m", settings, b"rlserve:result:t3", b"answer")
    assert time.monotonic() - started < 0.2  # a refused round trip: no retries, no waiting
    assert (lookups(metrics, "error"), lookups(metrics, "unavailable")) == (1, 2)
    assert writes(metrics, "dropped") == 1
    assert not cache.connected(settings.url)
    server.start()
    await until(lambda: cache.connected(settings.url), "connected again")
    assert await cache.lookup("m", settings, b"rlserve:result:t3") is None
    assert lookups(metrics, "miss") == 1
    await cache.close()
    server.stop()


async def test_a_lookup_slower_than_its_timeout_is_an_error_and_the_link_reconnects(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path, persistent=False)
    server.start()
    metrics = Metrics()
    cache = ResultCache(metrics)
    settings = CacheSettings(server.address(), 60000, 1024, 0.02)
    await connected(cache, settings)
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)  # accepts nothing, answers nothing
    try:
        started = time.monotonic()
        assert await cache.lookup("m", settings, b"rlserve:result:t4") is None
        waited = time.monotonic() - started
        for _ in range(2):  # the link is down: not asked, no waiting
            assert await cache.lookup("m", settings, b"rlserve:result:t4") is None
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert 0.02 <= waited < 0.2  # Redis's own time on the socket, then the error
    assert (lookups(metrics, "error"), lookups(metrics, "unavailable")) == (1, 2)
    started = time.monotonic()
    await until(lambda: cache.connected(settings.url), "connected again")
    assert time.monotonic() - started < 0.5  # one slow answer: connected again at once
    assert await cache.lookup("m", settings, b"rlserve:result:t4") is None
    assert lookups(metrics, "miss") == 1
    await cache.close()
    server.stop()


async def test_answers_queued_at_close_are_written_before_it_returns(store: RedisServer) -> None:
    metrics = Metrics()
    cache = ResultCache(metrics)
    settings = CacheSettings(store.address(), 60000, 1024, 0.5)
    await connected(cache, settings)
    keys = [b"rlserve:result:closing-%d" % i for i in range(50)]
    for key in keys:
        cache.store("m", settings, key, b"answer")
    await cache.close()  # what a server's shutdown awaits
    with redis.Redis(port=store.port) as raw:
        assert raw.exists(*keys) == len(keys)
    assert writes(metrics, "stored") == len(keys)


async def test_a_cache_that_cannot_connect_is_logged_without_its_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    cache = ResultCache(metrics)
    port = free_port()  # nothing listens there
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    settings = CacheSettings(url, 60000, 1024, 0.5)
    with caplog.at_level("WARNING", logger="rlserve.result_cache"):
        assert await cache.lookup("m", settings, b"rlserve:result:t6") is None
        await until(lambda: "connecting failed" in caplog.text, "logged")
        assert await cache.lookup("m", settings, b"rlserve:result:t6") is None
    assert not cache.connected(url)
    assert lookups(metrics, "unavailable") == 2
    assert "hunter2" not in caplog.text
    assert f"redis://***@127.0.0.1:{port}/0" in caplog.text
    await cache.close()
