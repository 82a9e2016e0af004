"""redis:// against the shared contract and a real redis-server, plus what only Redis does:
a server restart with persistence, trimming, claiming a dead consumer's entries, and the
errors when the server is down."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
import redis
import zstandard

from kernel.errors import ConfigError
from loop.buffers import open_consumer, open_producer
from loop.buffers.base import BufferOptions, BufferUnavailable
from loop.buffers.redis_streams import (
    FIELD_PLAIN,
    FIELD_ZSTD,
    RedisConsumer,
    RedisProducer,
    parse_url,
)
from tests.e2e.server import free_port
from tests.loop.buffers.contract import (
    Backend,
    BufferContract,
    assert_same_step,
    drain,
    episode,
    keys,
)
from tests.redis_server import RedisServer, running_redis


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def stream() -> str:
    return f"t-{uuid4().hex}"


@pytest.fixture
def raw(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=redis_server.port)
    yield client
    client.close()


class TestRedis(BufferContract):
    @pytest.fixture
    def backend(self, redis_server: RedisServer, stream: str, raw: redis.Redis) -> Backend:
        def inject(data: bytes, _: str) -> None:
            raw.xadd(stream, {"s": data})

        return Backend(redis_server.url(stream), crosses_processes=True, inject=inject)


def test_open_by_url_and_parameters(redis_server: RedisServer, stream: str) -> None:
    url = redis_server.url(stream, claim_idle_s=30, trim_every=5, socket_timeout=3)
    target = parse_url(url)
    assert (target.stream, target.claim_idle_s, target.trim_every) == (stream, 30.0, 5)
    assert "socket_timeout=3" in target.client_url
    assert "stream" not in target.client_url
    producer = open_producer(url)
    consumer = open_consumer(url, "trainer", "c1")
    assert isinstance(producer, RedisProducer)
    assert isinstance(consumer, RedisConsumer)
    producer.close()
    consumer.close()
    assert parse_url("redis://127.0.0.1:6379/0").stream == "rl_experience"
    with pytest.raises(ConfigError, match="trim_every"):
        parse_url("redis://127.0.0.1/0?trim_every=0")
    with pytest.raises(ConfigError, match="claim_idle_s"):
        parse_url("redis://127.0.0.1/0?claim_idle_s=soon")
    with pytest.raises(ConfigError, match="zstd"):
        open_producer(url, BufferOptions(compression="lz4"))


def test_compressed_records_round_trip(
    redis_server: RedisServer, stream: str, raw: redis.Redis
) -> None:
    url = redis_server.url(stream)
    steps = episode("z", 5)
    with_zstd = open_producer(url, BufferOptions(compression="zstd"))
    with_zstd.publish(steps[:3])
    plain = open_producer(url)
    plain.publish(steps[3:])
    fields = [set(entry or {}) for _, entry in raw.xrange(stream) or []]
    assert fields == [{FIELD_ZSTD}] * 3 + [{FIELD_PLAIN}] * 2
    consumer = open_consumer(url, "trainer", "c1")
    got = drain(consumer, 5, 5.0)
    for delivery, want in zip(got, steps, strict=True):
        assert_same_step(delivery.step, want)
    for client in (with_zstd, plain, consumer):
        client.close()


def test_restart_with_persistence_loses_no_acknowledged_publish(tmp_path: Path) -> None:
    """SIGKILL redis-server (appendonly yes, appendfsync always) and start it again on its
    directory: every acknowledged publish is there; a consumer restarted under its name
    gets its uncommitted deliveries again and not its committed ones; the old producer and
    the old consumer keep working."""
    with running_redis(tmp_path / "redis") as server:
        url = server.url("rl_experience")
        steps = episode("r", 40)
        producer = open_producer(url)
        consumer = open_consumer(url, "trainer", "c1")
        producer.publish(steps[:30])
        got = drain(consumer, 20, 5.0, batch=20)
        consumer.commit(got[:12])

        server.restart(crash=True)

        producer.publish(steps[30:])  # reconnects
        restarted = open_consumer(url, "trainer", "c1")
        resumed = drain(restarted, 28, 5.0)
        assert keys(resumed) == [s.key for s in steps[12:]]
        restarted.commit(resumed)
        assert restarted.counts.committed == 28
        assert producer.counts.published == 40
        assert producer.pending() == 0

        producer.publish(episode("after", 3))
        assert keys(drain(consumer, 3, 5.0)) == ["after:0", "after:1", "after:2"]
        for client in (producer, consumer, restarted):
            client.close()


def test_publish_rides_out_a_restart(tmp_path: Path) -> None:
    """A publish while Redis is down retries until it is back (within publish_timeout_s)."""
    with running_redis(tmp_path / "redis") as server:
        url = server.url("rl_experience")
        producer = open_producer(url, BufferOptions(publish_timeout_s=10.0))
        producer.publish(episode("a", 2))
        server.stop()
        restart = threading.Timer(0.5, server.start)
        restart.start()
        started = time.monotonic()
        producer.publish(episode("b", 2))
        restart.join()
        assert 0.4 < time.monotonic() - started < 10.0
        consumer = open_consumer(url, "trainer", "c1")
        assert keys(drain(consumer, 4, 5.0)) == ["a:0", "a:1", "b:0", "b:1"]
        producer.close()
        consumer.close()


def test_trimming_keeps_the_stream_bounded(
    redis_server: RedisServer, stream: str, raw: redis.Redis
) -> None:
    url = redis_server.url(stream, trim_every=10, trim_interval_s=60)
    producer = open_producer(url)
    fast = open_consumer(url, "trainer", "c1")
    lengths = []
    for batch in range(10):
        producer.publish(episode(f"e{batch}", 20))
        fast.commit(drain(fast, 20, 5.0))
        lengths.append(raw.xlen(stream))
    assert lengths == [0] * 10  # trimmed after every commit of 10 or more records

    producer.publish(episode("few", 5))
    fast.commit(drain(fast, 5, 5.0))
    assert raw.xlen(stream) == 5  # 5 < trim_every, and trim_interval_s not reached
    assert producer.pending() == 0  # a producer trims before it measures
    assert raw.xlen(stream) == 0

    slow = open_consumer(url, "offline", "c1")  # a second group holds what it has not read
    producer.publish(episode("held", 5))
    fast.commit(drain(fast, 5, 5.0))
    assert raw.xlen(stream) == 5
    assert producer.pending() == 5
    got = drain(slow, 5, 5.0)
    assert keys(got) == [f"held:{i}" for i in range(5)]  # trimmed ones were acknowledged
    slow.commit(got[:2])
    assert producer.pending() == 3
    slow.commit(got[2:])
    assert producer.pending() == 0
    for client in (producer, fast, slow):
        client.close()


def test_claim_abandoned_hands_a_dead_consumers_entries_over(
    redis_server: RedisServer, stream: str
) -> None:
    url = redis_server.url(stream)
    producer = open_producer(url)
    producer.publish(episode("d", 8))
    dead = RedisConsumer(url, "trainer", "dead", BufferOptions())
    taken = drain(dead, 5, 5.0, batch=5)
    assert len(taken) == 5
    dead.close()  # never commits, never comes back

    heir = RedisConsumer(url, "trainer", "heir", BufferOptions())
    assert heir.claim_abandoned(min_idle_s=30) == []  # not idle long enough
    time.sleep(0.25)
    claimed = heir.claim_abandoned(min_idle_s=0.2)
    assert keys(claimed) == keys(taken)
    heir.commit(claimed)
    assert keys(drain(heir, 3, 5.0)) == ["d:5", "d:6", "d:7"]

    back = RedisConsumer(url, "trainer", "dead", BufferOptions())
    assert back.poll(10, 0.1) == []  # its entries went to the heir
    for client in (producer, heir, back):
        client.close()


def test_poll_claims_when_configured(redis_server: RedisServer, stream: str) -> None:
    url = redis_server.url(stream, claim_idle_s=0.2)
    producer = open_producer(url)
    producer.publish(episode("p", 6))
    dead = open_consumer(url, "trainer", "dead")
    taken = drain(dead, 6, 5.0)
    dead.close()
    time.sleep(0.25)
    heir = open_consumer(url, "trainer", "heir")
    assert keys(drain(heir, 6, 5.0)) == keys(taken)
    producer.close()
    heir.close()


def test_deleted_pending_entries_are_skipped_not_stuck(
    redis_server: RedisServer, stream: str, raw: redis.Redis
) -> None:
    url = redis_server.url(stream)
    producer = open_producer(url)
    producer.publish(episode("x", 3))
    first = open_consumer(url, "trainer", "c1")
    got = drain(first, 3, 5.0)
    first.close()
    raw.xdel(stream, got[1].position)
    again = open_consumer(url, "trainer", "c1")
    assert keys(drain(again, 2, 5.0)) == ["x:0", "x:2"]
    assert raw.xpending(stream, "trainer")["pending"] == 2  # the deleted one was acknowledged
    producer.close()
    again.close()


def test_unavailable_server_names_the_url_and_the_fix() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?stream=down"
    producer = open_producer(url, BufferOptions(publish_timeout_s=0.3))
    started = time.monotonic()
    with pytest.raises(BufferUnavailable, match="redis-server") as raised:
        producer.publish(episode("a", 1))
    assert 0.2 < time.monotonic() - started < 3.0
    assert url in raised.value.message
    assert "publishing" in raised.value.message
    assert producer.counts.published == 0
    with pytest.raises(BufferUnavailable, match="creating the consumer group"):
        open_consumer(url, "trainer", "c1", BufferOptions(publish_timeout_s=0.1))
    producer.close()


def test_consumer_raises_unavailable_when_the_server_goes(tmp_path: Path) -> None:
    with running_redis(tmp_path / "redis") as server:
        url = server.url("rl_experience")
        consumer = open_consumer(url, "trainer", "c1", BufferOptions(publish_timeout_s=0.3))
        server.stop()
        with pytest.raises(BufferUnavailable, match="reading"):
            consumer.poll(10, 0.1)
        consumer.close()


def test_a_key_that_is_no_stream_is_a_config_error(
    redis_server: RedisServer, stream: str, raw: redis.Redis
) -> None:
    raw.set(stream, b"not a stream")
    with pytest.raises(ConfigError, match="stream=NAME"):
        open_consumer(redis_server.url(stream), "trainer", "c1")


def test_poison_entries_are_dead_lettered_and_a_restart_resumes(
    redis_server: RedisServer, stream: str, raw: redis.Redis
) -> None:
    """The issue's crash loop: a poison entry read in one batch with good ones. The good
    ones are delivered, the poison (bytes that are not a record, fields of another kind, a
    zstd bomb) goes to <stream>-dead and is acknowledged; a restarted consumer of the same
    name gets its uncommitted good entries again, and nothing else."""
    url = redis_server.url(stream)
    producer = open_producer(url)
    producer.publish(episode("a", 2))
    raw.xadd(stream, {"s": b"\xc1"})
    raw.xadd(stream, {"other": b"x"})
    raw.xadd(stream, {"z": zstandard.ZstdCompressor().compress(bytes(64 << 20))})
    producer.publish(episode("b", 2))
    producer.close()
    options = BufferOptions(max_record_bytes=1 << 20)
    consumer = open_consumer(url, "g", "c", options)
    assert keys(drain(consumer, 4, 5.0)) == ["a:0", "a:1", "b:0", "b:1"]
    assert consumer.counts.undecodable == 3
    consumer.close()  # nothing committed: the good ones come again
    dead = raw.xrange(f"{stream}-dead")
    assert [fields.get(b"s", fields.get(b"other")) for _, fields in dead][:2] == [b"\xc1", b"x"]
    assert len(dead) == 3
    assert all(b"origin" in fields for _, fields in dead)
    again = open_consumer(url, "g", "c", options)
    got = drain(again, 4, 5.0)
    assert keys(got) == ["a:0", "a:1", "b:0", "b:1"]
    assert again.counts.undecodable == 0
    again.commit(got)
    assert raw.xpending(stream, "g")["pending"] == 0
    again.close()
