"""kafka:// against the shared contract and a real Kafka-protocol broker (noida-db, see
``kafka_broker``), plus what only Kafka does: the topic and its partitions, keyed
partitioning, a group splitting partitions, committed offsets, static membership, lag as
back-pressure, and the errors when the brokers are down."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from uuid import uuid4

import confluent_kafka
import numpy as np
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kernel.errors import ConfigError
from loop.buffers import open_consumer, open_producer
from loop.buffers.base import BufferOptions, BufferUnavailable, Delivery, RecordTooLarge
from loop.buffers.kafka import (
    DEFAULT_PARTITIONS,
    DEFAULT_TOPIC,
    KafkaConsumer,
    KafkaProducer,
    parse_url,
)
from loop.experience import Deduplicator
from tests.e2e.server import free_port
from tests.loop.buffers.contract import (
    Backend,
    BufferContract,
    assert_same_step,
    child,
    drain,
    episode,
    keys,
    read_report,
    wait_for,
)
from tests.loop.buffers.kafka_broker import KafkaBroker, running_broker

TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    with running_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture
def topic() -> str:
    return f"t-{uuid4().hex}"


@pytest.fixture
def admin(kafka_broker: KafkaBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_broker.bootstrap})


@pytest.fixture
def opened() -> Iterator[list[KafkaProducer | KafkaConsumer]]:
    """Clients a test opens; closed after it (consumers first: they leave the group)."""
    clients: list[KafkaProducer | KafkaConsumer] = []
    yield clients
    for client in sorted(clients, key=lambda c: isinstance(c, KafkaProducer)):
        client.close()


class TestKafka(BufferContract):
    timeout_s = TIMEOUT_S  # the first poll joins the group

    @pytest.fixture
    def backend(self, kafka_broker: KafkaBroker, topic: str) -> Backend:
        def inject(data: bytes, stream: str) -> None:  # keyed as the stream's own records
            producer = confluent_kafka.Producer({"bootstrap.servers": kafka_broker.bootstrap})
            producer.produce(topic, data, stream.encode())
            assert producer.flush(TIMEOUT_S) == 0

        url = kafka_broker.url(topic, group="trainer")
        return Backend(url, crosses_processes=True, inject=inject)


def _producer(url: str, opened: list, **options: object) -> KafkaProducer:
    producer = open_producer(url, BufferOptions(**options))  # type: ignore[arg-type]
    assert isinstance(producer, KafkaProducer)
    opened.append(producer)
    return producer


def _consumer(url: str, opened: list, name: str = "c1", group: str = "trainer") -> KafkaConsumer:
    consumer = open_consumer(url, group, name)
    assert isinstance(consumer, KafkaConsumer)
    opened.append(consumer)
    return consumer


def _partition_counts(admin: AdminClient) -> dict[str, int]:
    return {name: len(t.partitions) for name, t in admin.list_topics(timeout=5).topics.items()}


def _committed(admin: AdminClient, group: str, topic: str, partitions: int) -> dict[int, int]:
    request = [
        ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    ]
    answer = admin.list_consumer_group_offsets(request)[group].result(timeout=5)
    return {tp.partition: tp.offset for tp in answer.topic_partitions if tp.offset >= 0}


def _join(*consumers: KafkaConsumer, partitions: int = DEFAULT_PARTITIONS) -> None:
    """Poll until the consumers hold every partition between them, each a different set."""

    def settled() -> bool:
        for consumer in consumers:
            consumer.poll(max_records=100, timeout_s=0.05)  # joins; deliveries not wanted
        held = [set(c.assigned_partitions()) for c in consumers]
        return all(held) and sum(map(len, held)) == partitions == len(set().union(*held))

    wait_for(settled, TIMEOUT_S, "the group to split the partitions")


# -- the URL -------------------------------------------------------------------------------


def test_url_parameters() -> None:
    target = parse_url(
        "kafka://b1:9092,b2:9092/exp?partitions=4&replicas=3&group=trainer,offline&group=eval"
        "&timeout_s=2&security.protocol=SASL_SSL&sasl.password=hunter2"
        "&producer.linger.ms=20&consumer.session.timeout.ms=30000"
    )
    assert (target.bootstrap, target.topic, target.partitions, target.replicas) == (
        "b1:9092,b2:9092",
        "exp",
        4,
        3,
    )
    assert target.groups == ("trainer", "offline", "eval")
    assert target.timeout_s == 2.0
    assert target.common == {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}
    assert target.producer == {"linger.ms": "20"}
    assert target.consumer == {"session.timeout.ms": "30000"}
    assert "hunter2" not in target.url  # messages show the URL masked
    default = parse_url("kafka://b1:9092")
    assert (default.topic, default.partitions, default.replicas, default.groups) == (
        DEFAULT_TOPIC,
        16,
        -1,
        (),
    )
    for bad, word in [
        ("kafka:///t", "HOST:PORT"),
        ("kafka://u:p@b1:9092/t", "sasl.username"),
        ("kafka://b1:9092/bad topic", "topic name"),
        ("kafka://b1:9092/t?partitions=0", "partitions"),
        ("kafka://b1:9092/t?partitions=many", "whole numbers"),
        ("kafka://b1:9092/t?replicas=0", "replicas"),
        ("kafka://b1:9092/t?timeout_s=0", "timeout_s"),
        ("kafka://b1:9092/t?stream=x", "unknown parameter 'stream'"),
    ]:
        with pytest.raises(ConfigError, match=word):
            parse_url(bad)


@pytest.mark.parametrize("group", ["", "g" * 201, "bad group"])
def test_a_bad_group_name_is_refused_before_the_brokers_are_asked(
    kafka_broker: KafkaBroker, topic: str, group: str
) -> None:
    # An empty group.id made librdkafka abort the whole process (SIGABRT), brokers up or
    # down; the same rule as file:// and the loop config now refuses it first.
    down = f"kafka://127.0.0.1:{free_port()}/t?timeout_s=5"
    for url in (down, kafka_broker.url(topic)):
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"consumer group .*1 to 200 letters, digits"):
            open_consumer(url, group, "c1")
        assert time.monotonic() - started < 1  # no broker was waited for
    with pytest.raises(ConfigError, match=r"group: consumer group 'bad group'"):
        open_producer(kafka_broker.url(topic, group="trainer,bad group"))


def test_a_record_the_producer_finds_too_large_is_refused_for_good(
    kafka_broker: KafkaBroker, topic: str, opened: list
) -> None:
    producer = _producer(kafka_broker.url(topic, **{"producer.message.max.bytes": 1000}), opened)
    small = episode("e", 2)
    large = replace(small[1], observation=np.zeros(500, np.float64))  # 4 KB: over 1000 bytes
    with pytest.raises(
        RecordTooLarge,
        match=r"step e:1's record is [\d,]+ bytes, more than the "
        r"producer's message.max.bytes \(1000\).*The 1 steps before it",
    ) as caught:
        producer.publish([small[0], large])
    assert not isinstance(caught.value, BufferUnavailable)  # not transient: never retried
    producer.flush(TIMEOUT_S)
    assert producer.counts.published == 1


def test_records_the_brokers_refuse_as_too_large_are_refused_for_good(
    kafka_broker: KafkaBroker, topic: str, admin: AdminClient, opened: list
) -> None:
    # The topic takes records of 100 bytes at most: the client sends them, the broker
    # answers MSG_SIZE_TOO_LARGE. Republishing them could never succeed.
    created = admin.create_topics([NewTopic(topic, 16, 1, config={"max.message.bytes": "100"})])
    created[topic].result(TIMEOUT_S)
    producer = _producer(kafka_broker.url(topic), opened)
    producer.publish(episode("e", 3))
    with pytest.raises(
        RecordTooLarge,
        match=r"the brokers refused 3 published steps as too "
        r"large \(MSG_SIZE_TOO_LARGE.*they are lost.*max.message.bytes",
    ):
        producer.flush(TIMEOUT_S)
    assert (producer.counts.published, producer.take_undelivered()) == (0, [])
    producer.publish(episode("f", 1))  # told once: the producer goes on
    with pytest.raises(RecordTooLarge, match="refused 1 published steps"):
        producer.flush(TIMEOUT_S)


def test_bad_librdkafka_property_names_it(kafka_broker: KafkaBroker, topic: str) -> None:
    with pytest.raises(ConfigError, match=r"no\.such\.property"):
        open_producer(kafka_broker.url(topic, **{"producer.no.such.property": "1"}))


def test_brokers_down_name_the_url_and_the_fix() -> None:
    url = f"kafka://127.0.0.1:{free_port()}/t?timeout_s=0.5&sasl.password=hunter2"
    for opening in (lambda: open_producer(url), lambda: open_consumer(url, "trainer", "c1")):
        started = time.monotonic()
        with pytest.raises(BufferUnavailable, match=r"Start Kafka at 127\.0\.0\.1") as caught:
            opening()
        assert time.monotonic() - started < 3
        assert "hunter2" not in caught.value.message
        assert "sasl.password=***" in caught.value.message


# -- the topic and its partitions ----------------------------------------------------------


def test_topic_created_with_16_partitions(
    kafka_broker: KafkaBroker, topic: str, admin: AdminClient, opened: list
) -> None:
    _consumer(kafka_broker.url(topic), opened)  # whoever comes first creates it
    assert _partition_counts(admin)[topic] == 16
    _producer(kafka_broker.url(topic), opened)  # exists: used as it is
    small = f"{topic}-4"
    _producer(kafka_broker.url(small, partitions=4), opened)
    counts = _partition_counts(admin)
    assert (counts[topic], counts[small]) == (16, 4)


def test_an_episode_stays_in_one_partition(
    kafka_broker: KafkaBroker, topic: str, opened: list
) -> None:
    url = kafka_broker.url(topic)
    episodes = {f"ep{e}": episode(f"ep{e}", 12) for e in range(24)}
    producer = _producer(url, opened)
    for start in range(0, 12, 4):  # interleaved publishes, as vectorised workers make
        producer.publish([s for steps in episodes.values() for s in steps[start : start + 4]])
    producer.flush()
    consumer = _consumer(url, opened)
    got = drain(consumer, 24 * 12, TIMEOUT_S)
    partitions: dict[str, set[int]] = defaultdict(set)
    order: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for d in got:
        partitions[d.step.stream].add(d.position[0])
        order[d.step.stream].append((d.position[1], d.step.position))
        assert_same_step(d.step, episodes[d.step.stream][d.step.position])
    assert all(len(p) == 1 for p in partitions.values()), partitions
    assert len(set().union(*partitions.values())) > 4  # keys spread over the partitions
    for steps in order.values():  # offsets rise with steps
        assert [s for _, s in sorted(steps)] == list(range(12))


def test_compression_round_trips(kafka_broker: KafkaBroker, topic: str, opened: list) -> None:
    steps = episode("z", 5)
    zstd = _producer(kafka_broker.url(topic), opened, compression="zstd")
    lz4 = _producer(kafka_broker.url(topic, **{"producer.compression.type": "lz4"}), opened)
    zstd.publish(steps[:3])
    zstd.flush()  # two producers: order holds only once the first one's steps are stored
    lz4.publish(steps[3:])
    lz4.flush()
    got = drain(_consumer(kafka_broker.url(topic), opened), 5, TIMEOUT_S)
    assert keys(got) == [s.key for s in steps]
    for d, want in zip(got, steps, strict=True):
        assert_same_step(d.step, want)


# -- consumer groups and committed offsets -------------------------------------------------


def test_two_consumers_split_the_partitions(
    kafka_broker: KafkaBroker, topic: str, opened: list
) -> None:
    url = kafka_broker.url(topic, group="trainer")
    first, second = _consumer(url, opened, "c1"), _consumer(url, opened, "c2")
    _join(first, second)
    held = {c.name: set(c.assigned_partitions()) for c in (first, second)}
    assert len(held["c1"]) == len(held["c2"]) == 8

    steps = [s for e in range(40) for s in episode(f"g{e}", 5)]
    producer = _producer(url, opened)
    producer.publish(steps)
    producer.flush()
    got: dict[str, list[Delivery]] = {"c1": [], "c2": []}
    deadline = time.monotonic() + TIMEOUT_S
    while sum(map(len, got.values())) < len(steps) and time.monotonic() < deadline:
        for consumer in (first, second):
            batch = consumer.poll(max_records=50, timeout_s=0.05)
            got[consumer.name].extend(batch)
            consumer.commit(batch)
    for name, deliveries in got.items():
        assert deliveries, f"{name} got nothing"
        assert {d.position[0] for d in deliveries} <= held[name]
    dedupe = Deduplicator()
    fresh = [d.step.key for d in got["c1"] + got["c2"] if dedupe.fresh(d.step)]
    assert sorted(fresh) == sorted(s.key for s in steps)
    wait_for(lambda: producer.pending() == 0, TIMEOUT_S, "pending() == 0 after both committed")

    first.close()  # leaves the group: its partitions move to c2 at once
    wait_for(
        lambda: second.poll(10, 0.05) == [] and len(second.assigned_partitions()) == 16,
        3.0,
        "c2 to take over c1's partitions",
    )


def test_commit_is_a_position_and_restart_resumes_there(
    kafka_broker: KafkaBroker, topic: str, admin: AdminClient, opened: list
) -> None:
    url = kafka_broker.url(topic)
    steps = episode("one", 10)  # one episode: one partition
    producer = _producer(url, opened)
    producer.publish(steps)
    producer.flush()
    consumer = _consumer(url, opened)
    got = drain(consumer, 10, TIMEOUT_S)
    assert keys(got) == [s.key for s in steps]
    partition = got[0].position[0]
    consumer.commit([got[6]])  # offsets 0..6 are committed with it
    assert _committed(admin, "trainer", topic, 16) == {partition: got[6].position[1] + 1}
    assert consumer.counts.committed == 1
    consumer.close()

    restarted = _consumer(url, opened)
    assert keys(drain(restarted, 3, TIMEOUT_S)) == [s.key for s in steps[7:]]
    assert restarted.poll(max_records=10, timeout_s=0.3) == []


def test_killed_consumer_restarted_under_its_name_gets_its_partitions_back(
    kafka_broker: KafkaBroker, topic: str, opened: list
) -> None:
    url = kafka_broker.url(topic, group="trainer")
    producer = _producer(url, opened)
    producer.publish([s for e in range(60) for s in episode(f"k{e}", 2)])
    producer.flush()
    other = _consumer(url, opened, "c2")
    _join(other)  # first: the child joins while c2 polls (a rebalance needs both to poll)
    proc = child("consume", url, "trainer", "c1", "1", str(TIMEOUT_S))
    try:
        assert _report_while_polling(proc, other) >= 1
        _join(other, partitions=8)  # c1 holds the other eight
        before = set(other.assigned_partitions())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=TIMEOUT_S)

    restarted = _consumer(url, opened, "c1")
    started = time.monotonic()
    wait_for(
        lambda: restarted.poll(10, 0.05) is not None and restarted.assigned_partitions() != [],
        3.0,
        "c1 to get partitions again",
    )
    assert time.monotonic() - started < 2.0  # static membership: no session timeout to wait
    other.poll(10, 0.3)
    assert set(restarted.assigned_partitions()) == set(range(16)) - before
    assert set(other.assigned_partitions()) == before  # no rebalance moved c2's partitions


def _report_while_polling(proc: subprocess.Popen[str], consumer: KafkaConsumer) -> int:
    """The child's ``DELIVERED n``, polling ``consumer`` meanwhile (so the group settles)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + TIMEOUT_S
    while not select.select([proc.stdout], [], [], 0)[0]:
        if time.monotonic() > deadline or proc.poll() is not None:
            pytest.fail(f"the child said nothing; stderr:\n{proc.communicate(timeout=5)[1]}")
        consumer.poll(max_records=100, timeout_s=0.05)
    return read_report(proc, "DELIVERED", TIMEOUT_S)


def test_two_running_consumers_with_one_name_fence_the_first(
    kafka_broker: KafkaBroker, topic: str, opened: list
) -> None:
    url = kafka_broker.url(topic)
    first = _consumer(url, opened, "same", group=f"g-{topic}")
    _join(first)
    second = _consumer(url, opened, "same", group=f"g-{topic}")

    def fenced() -> bool:
        second.poll(max_records=10, timeout_s=0.05)
        first.poll(max_records=10, timeout_s=0.05)  # raises once fenced
        return False

    with pytest.raises(BufferUnavailable, match="give every running consumer of a group its own"):
        wait_for(fenced, TIMEOUT_S, "the first consumer to be fenced")
    with pytest.raises(BufferUnavailable, match="fenced"):
        first.commit([])  # it stays unusable


# -- back-pressure -------------------------------------------------------------------------


def test_pending_counts_the_slowest_group(
    kafka_broker: KafkaBroker, topic: str, opened: list
) -> None:
    url = kafka_broker.url(topic, group="trainer,offline")
    producer = _producer(url, opened)
    producer.publish(episode("a", 6) + episode("b", 4))
    producer.flush()
    assert producer.pending() == 10  # neither group has committed anything
    trainer = _consumer(url, opened, "t1", group="trainer")
    trainer.commit(drain(trainer, 10, TIMEOUT_S))
    assert producer.pending() == 10  # offline still needs all of them
    offline = _consumer(url, opened, "o1", group="offline")
    got = drain(offline, 10, TIMEOUT_S)
    offline.commit([d for d in got if d.step.stream == "a"])
    assert producer.pending() == 4


def test_without_a_group_pending_is_the_local_queue(
    kafka_broker: KafkaBroker, topic: str, opened: list
) -> None:
    producer = _producer(kafka_broker.url(topic), opened, max_pending=5, publish_timeout_s=0.1)
    for e in range(4):  # 20 records, never consumed: no group to measure against
        producer.publish(episode(f"n{e}", 5))
        producer.flush()
    assert producer.pending() == 0
    assert producer.counts.published == 20


# -- failures ------------------------------------------------------------------------------


def test_broker_gone_undelivered_steps_are_kept_and_reported(tmp_path: Path) -> None:
    topic = f"t-{uuid4().hex}"
    with running_broker(tmp_path) as broker:
        url = broker.url(topic, timeout_s=1, **{"producer.message.timeout.ms": "1500"})
        producer = open_producer(url)
        consumer = open_consumer(url, "trainer", "c1")
        assert isinstance(producer, KafkaProducer)
        producer.publish(episode("before", 3))
        producer.flush()
        assert len(drain(consumer, 3, TIMEOUT_S)) == 3
        broker.stop()

        lost = episode("after", 4)
        producer.publish(lost)  # queued locally: the client has not given up yet
        assert producer.counts.published == 7
        with pytest.raises(BufferUnavailable, match=r"not delivered|not acknowledged"):
            producer.flush(timeout_s=5)
        wait_for(lambda: producer._producer.poll(0.1) >= 0 and producer.failed == 4, 5, "4 fails")
        assert producer.counts.published == 3  # published = stored by Kafka
        assert [s.key for s in producer.take_undelivered()] == [s.key for s in lost]
        assert producer.undelivered == []

        down = f"Start Kafka at {re.escape(broker.bootstrap)}"
        with pytest.raises(BufferUnavailable, match=down):
            drain(consumer, 1, 5)
        consumer.close()
        producer.close()
