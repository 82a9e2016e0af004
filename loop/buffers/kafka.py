"""Kafka experience buffer: ``kafka://host:9092[,host2:9092]/TOPIC?partitions=16&group=trainer``.

Production points at a real Kafka cluster (the topic as ``k8s/rl/kafka-topic.yaml``
declares it for Strimzi); the tests use ``noida-db``, a small Kafka-protocol broker.
Built on ``confluent-kafka`` (librdkafka).

Every step is one record: the key is its ``episode_id`` (UTF-8), the value
:func:`loop.experience.encode`'s bytes. Records are partitioned by a hash of the key
(``murmur2_random``, as Java clients do), so an episode stays in one partition and in order.

Query parameters of the URL:

- the path names the topic, default ``rl_experience``;
- ``partitions`` (default 16) and ``replicas`` (default: the broker's
  ``default.replication.factor``): used only when the topic is missing and this client
  creates it (``AdminClient.create_topics``; a topic that exists, or that another client
  creates at the same time, is used as it is: a different partition count is logged);
- ``group``: the consumer group(s) a *producer* measures back-pressure against (repeat it,
  or separate names with commas); consumers are given their group by ``open_consumer``.
  Group names follow the buffers' one rule (``loop.group_names``),
  checked before the brokers are asked (librdkafka aborts the process on an empty one);
- ``timeout_s`` (default 10): how long to wait for the brokers when opening, measuring and
  committing;
- any parameter with a dot is a librdkafka property (``security.protocol=SASL_SSL``,
  ``sasl.mechanisms=SCRAM-SHA-512``, …) for every client; prefixed ``producer.`` or
  ``consumer.`` it goes to that client only (``producer.linger.ms=20``,
  ``consumer.session.timeout.ms=30000``). Passwords in the URL are masked in messages.

Guarantees (``loop.buffers.base``):

- **Publishing**: ``produce`` into librdkafka's queue, then ``poll(0)``; the client sends
  batches (``linger.ms=1``: about 1.3 ms from publish to a waiting consumer's poll on
  loopback, 5.5 ms with librdkafka's default of 5) with ``acks=all`` and
  ``enable.idempotence=true`` (no duplicates or reordering
  from its own retries; noida-db accepts it; for a broker that does not, add
  ``producer.enable.idempotence=false``). Compression: ``BufferOptions.compression``
  (``zstd``) or ``producer.compression.type`` (``lz4``, ``gzip``, ``snappy``) in the URL.
  ``flush`` waits for every acknowledgment. A record the client gives up on
  (``message.timeout.ms``, default 5 minutes) is not lost silently: it leaves
  ``counts.published``, its step goes to :attr:`KafkaProducer.undelivered`, and the next
  ``publish`` or ``flush`` raises :class:`~loop.buffers.base.BufferUnavailable` saying so
  (republish with ``producer.publish(producer.take_undelivered())``).
- **Back-pressure on consumer lag**: ``pending()`` is, summed over partitions, the high
  watermark minus the lowest committed offset among the URL's groups (a group that
  has committed nothing in a partition counts from the partition's start), plus the records
  still in this producer's queue. Without ``group`` in the URL a producer cannot know
  its consumers: ``pending()`` is then its own queue only (records not yet acknowledged by
  the brokers), so back-pressure protects the producer's memory and the brokers' retention
  bounds the topic. A producer measures (three admin requests) when its estimate (the last
  measurement plus what it published since) nears ``max_pending``, and at least every
  second while publishing; several producers may each overshoot by a batch.
- **Delivery**: consumers of a group split the partitions. ``group.instance.id`` is the
  consumer's name (static membership, KIP-345): a consumer killed and restarted under the
  same name gets its partitions back at once, with no rebalance, and resumes from the
  committed offsets (at least once: what it had not committed comes again). ``close``
  unsubscribes first, which makes a static member leave the group, so its partitions move
  to the others at once. A consumer killed and *not* restarted keeps its partitions until
  ``session.timeout.ms`` (10 s here; a consumer under another name waits as long; noida-db
  never expires it). Names must be unique among a group's running consumers: a second one
  with the same name fences the first. ``poll`` returns what is fetched already, else
  waits for the first record; a record that is not an experience record is logged,
  counted (``undecodable``) and skipped: the next commit, a position, passes it.
  ``heartbeat.interval.ms`` (1 s) bounds how soon running members notice a rebalance;
  joining takes about 0.4 s against noida-db with 200 ms.
- **Commit**: synchronous, for the highest offset + 1 per partition among the deliveries
  (Kafka commits positions, so earlier records of those partitions are committed too). A
  commit that loses to a rebalance (the partition moved) is logged and not counted: those
  records are delivered again to the partition's new owner (deduplicate with
  ``loop.experience.Deduplicator``).
- **Errors**: brokers unreachable, a commit that fails, a fatal client error:
  :class:`~loop.buffers.base.BufferUnavailable` naming the URL and what to do.

librdkafka's own log lines go to the ``rlserve.buffers.kafka`` logger.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import confluent_kafka
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from kernel.errors import ConfigError
from loop.buffers.base import (
    BufferOptions,
    BufferUnavailable,
    ConsumerCounts,
    Delivery,
    ProducerCounts,
    RecordReader,
    RecordTooLarge,
    overflow,
)
from loop.experience import Record, encode
from loop.group_names import check_group_name, group_name_problem

log = logging.getLogger("rlserve.buffers.kafka")

DEFAULT_TOPIC = "rl_experience"
DEFAULT_PARTITIONS = 16
DEFAULT_TIMEOUT_S = 10.0
MEASURE_EVERY_S = 1.0  # a publishing producer measures the lag at least this often
WAIT_SLICE_S = 0.02  # while waiting for room: serve delivery reports, then measure again
LEAVE_TIMEOUT_S = 2.0  # close: how long to wait for the client to give up its partitions
_OUR_PARAMETERS = ("partitions", "replicas", "group", "timeout_s")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_SECRET = re.compile(r"password|secret|token", re.IGNORECASE)

PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "partitioner": "murmur2_random",  # as Java clients hash keys
    "linger.ms": 1,  # here: 1.3 ms publish-to-poll at the median, 5.5 ms with the default 5
}
CONSUMER_DEFAULTS: dict[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 10_000,  # a killed consumer's partitions wait this long for it
    "heartbeat.interval.ms": 1_000,  # how soon a running member notices a rebalance
}
# Commits the group refused because it moved on: the records come again to the new owner.
_REBALANCED = (
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._ASSIGNMENT_LOST,
)


# -- the URL -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KafkaTarget:
    """A ``kafka://`` buffer URL, split into the topic's settings and client properties."""

    url: str  # for messages: passwords masked
    bootstrap: str  # host:port[,host:port…]
    topic: str = DEFAULT_TOPIC
    partitions: int = DEFAULT_PARTITIONS
    replicas: int = -1  # the broker's default
    groups: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    common: dict[str, str] = field(default_factory=dict)  # librdkafka, every client
    producer: dict[str, str] = field(default_factory=dict)
    consumer: dict[str, str] = field(default_factory=dict)


def parse_url(url: str) -> KafkaTarget:
    """Split ``url``; :class:`ConfigError` naming the parameter when one is malformed."""
    parts = urlsplit(url)
    shown = _masked(url)
    if parts.scheme != "kafka" or not parts.netloc or "@" in parts.netloc:
        raise ConfigError(
            f"data_buffer {shown!r}: write a Kafka buffer as kafka://HOST:PORT[,HOST:PORT]/TOPIC"
            " (credentials go in sasl.username and sasl.password parameters)"
        )
    topic = parts.path.strip("/") or DEFAULT_TOPIC
    if not _TOPIC_NAME.fullmatch(topic):
        raise ConfigError(
            f"data_buffer {shown!r}: topic {topic!r} is not a Kafka topic name; use letters, "
            "digits, '.', '_' and '-' (at most 249)"
        )
    given = _parameters(parts.query, shown)
    try:
        target = KafkaTarget(
            url=shown,
            bootstrap=parts.netloc,
            topic=topic,
            partitions=int(given.ours.get("partitions", DEFAULT_PARTITIONS)),
            replicas=int(given.ours.get("replicas", -1)),
            groups=tuple(dict.fromkeys(given.groups)),
            timeout_s=float(given.ours.get("timeout_s", DEFAULT_TIMEOUT_S)),
            common=given.common,
            producer=given.producer,
            consumer=given.consumer,
        )
    except ValueError as error:
        raise ConfigError(
            f"data_buffer {shown!r}: {error}; partitions and replicas are whole numbers, "
            "timeout_s seconds"
        ) from error
    if target.partitions < 1 or not (target.replicas >= 1 or target.replicas == -1):
        raise ConfigError(
            f"data_buffer {shown!r}: partitions must be at least 1 and replicas at least 1 "
            "(or left out: the broker's default)"
        )
    if target.timeout_s <= 0:
        raise ConfigError(f"data_buffer {shown!r}: timeout_s must be positive")
    return target


@dataclass
class _Parameters:
    """A Kafka URL's query, sorted: ours, consumer groups, and librdkafka's properties."""

    ours: dict[str, str] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    common: dict[str, str] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)
    consumer: dict[str, str] = field(default_factory=dict)


def _parameters(query: str, shown: str) -> _Parameters:
    given = _Parameters()
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "group":
            given.groups.extend(_groups(value, shown))
        elif key in _OUR_PARAMETERS:
            given.ours[key] = value
        elif key.startswith("producer."):
            given.producer[key.removeprefix("producer.")] = value
        elif key.startswith("consumer."):
            given.consumer[key.removeprefix("consumer.")] = value
        elif "." in key:
            given.common[key] = value
        else:
            raise ConfigError(
                f"data_buffer {shown!r}: unknown parameter {key!r}; use "
                f"{', '.join(_OUR_PARAMETERS)}, or a librdkafka property (with a dot, "
                "optionally prefixed producer. or consumer.)"
            )
    return given


def _groups(value: str, shown: str) -> list[str]:
    groups = [group for group in value.split(",") if group]
    for group in groups:
        problem = group_name_problem(group)
        if problem is not None:
            raise ConfigError(f"data_buffer {shown!r}: group: {problem}")
    return groups


def _masked(url: str) -> str:
    parts = urlsplit(url)
    query = [(k, "***" if _SECRET.search(k) else v) for k, v in parse_qsl(parts.query, True)]
    return urlunsplit(parts._replace(query=urlencode(query, safe=",*")))


# -- what producer and consumer share ----------------------------------------------------


class _Topic:
    """The topic on its cluster: creating it, measuring lag, and the error messages."""

    def __init__(self, url: str, options: BufferOptions) -> None:
        self.target = parse_url(url)
        self.options = options
        self.admin = AdminClient(self.config())
        self.partitions = self.ensure()

    def config(self, *layers: dict[str, Any]) -> dict[str, Any]:
        """librdkafka properties: the brokers and our logger, then ``layers`` in order,
        then the URL's common properties."""
        merged: dict[str, Any] = {"bootstrap.servers": self.target.bootstrap, "logger": log}
        for layer in layers:
            merged.update(layer)
        merged.update(self.target.common)
        return merged

    def client(self, kind: type[Any], config: dict[str, Any]) -> Any:
        """A librdkafka client; a property it rejects is a :class:`ConfigError`."""
        try:
            return kind(config)
        except (KafkaException, ValueError, TypeError) as error:
            raise ConfigError(
                f"data_buffer {self.target.url!r}: librdkafka rejected the configuration: "
                f"{_reason(error)}; fix or remove that parameter"
            ) from error

    def unavailable(self, doing: str, error: object) -> BufferUnavailable:
        return BufferUnavailable(
            f"Kafka buffer {self.target.url} is unavailable while {doing}: {_reason(error)}. "
            f"Start Kafka at {self.target.bootstrap} (production: the Strimzi cluster; tests: "
            "noida-db), or point data_buffer at the right brokers."
        )

    # -- the topic

    def ensure(self) -> int:
        """The topic's partition count, creating the topic if it is missing."""
        count = self._partition_count()
        if count is None:
            self._create()
            count = self._wait_for_topic()
        if count != self.target.partitions:
            log.warning(
                "kafka topic %s has %d partitions, not the %d asked for: using it as it is",
                self.target.topic,
                count,
                self.target.partitions,
            )
        return count

    def _partition_count(self) -> int | None:
        # All topics, not the one by name: a named metadata request makes brokers with
        # auto.create.topics.enable (noida-db) create it with their default partition count.
        try:
            metadata = self.admin.list_topics(timeout=self.target.timeout_s)
        except KafkaException as error:
            raise self.unavailable("reading the cluster's metadata", error) from error
        topic = metadata.topics.get(self.target.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            return None
        return len(topic.partitions)

    def _create(self) -> None:
        target = self.target
        new = NewTopic(
            target.topic, num_partitions=target.partitions, replication_factor=target.replicas
        )
        future = self.admin.create_topics([new], request_timeout=target.timeout_s)[target.topic]
        try:
            future.result(timeout=target.timeout_s + 1)
        except KafkaException as error:
            code = error.args[0].code() if error.args else None
            if code == KafkaError.TOPIC_ALREADY_EXISTS:
                return  # another client created it first
            if code in (KafkaError.INVALID_REPLICATION_FACTOR, KafkaError.INVALID_PARTITIONS):
                raise ConfigError(
                    f"data_buffer {target.url!r}: the brokers refused to create topic "
                    f"{target.topic!r}: {_reason(error)}; set partitions= and replicas= to "
                    "what the cluster allows"
                ) from error
            raise BufferUnavailable(
                f"Kafka buffer {target.url}: could not create topic {target.topic!r}: "
                f"{_reason(error)}. Create it beforehand (k8s/rl/kafka-topic.yaml) or allow "
                "this client to create topics."
            ) from error
        log.info("created kafka topic %s (%d partitions)", target.topic, target.partitions)

    def _wait_for_topic(self) -> int:
        deadline = time.monotonic() + self.target.timeout_s
        while True:
            count = self._partition_count()
            if count is not None:
                return count
            if time.monotonic() >= deadline:
                raise self.unavailable("waiting for the new topic", "it never showed up")
            time.sleep(0.05)

    # -- lag

    def lag(self, groups: Sequence[str], timeout_s: float) -> int:
        """Records not yet committed by the slowest of ``groups``, summed over partitions."""
        partitions = [TopicPartition(self.target.topic, p) for p in range(self.partitions)]
        try:
            high = self._offsets(partitions, OffsetSpec.latest(), timeout_s)
            low = self._offsets(partitions, OffsetSpec.earliest(), timeout_s)
            floor = dict(high)
            for group in groups:
                for p, offset in self._committed(group, partitions, timeout_s).items():
                    floor[p] = min(floor[p], max(offset, low[p]))  # none yet: from the start
        except KafkaException as error:
            raise self.unavailable("measuring consumer lag", error) from error
        return sum(max(0, high[p] - floor[p]) for p in high)

    def _offsets(
        self, partitions: list[TopicPartition], spec: OffsetSpec, timeout_s: float
    ) -> dict[int, int]:
        futures = self.admin.list_offsets(
            {tp: spec for tp in partitions}, request_timeout=timeout_s
        )
        return {tp.partition: f.result(timeout=timeout_s + 1).offset for tp, f in futures.items()}

    def _committed(
        self, group: str, partitions: list[TopicPartition], timeout_s: float
    ) -> dict[int, int]:
        request = [ConsumerGroupTopicPartitions(group, partitions)]
        futures = self.admin.list_consumer_group_offsets(request, request_timeout=timeout_s)
        answer = futures[group].result(timeout=timeout_s + 1)
        return {tp.partition: tp.offset for tp in answer.topic_partitions}


def _log_client_error(who: str, error: KafkaError) -> None:
    """Log an error the client reported (a lost connection only at debug level: the
    client reconnects, and logs it itself)."""
    transient = error.code() == KafkaError._TRANSPORT
    log.log(logging.DEBUG if transient else logging.WARNING, "kafka %s: %s", who, _reason(error))


def _is_fatal(error: KafkaError) -> bool:
    """The client cannot go on (the error callback reports it as code ``_FATAL``)."""
    return bool(error.fatal()) or error.code() == KafkaError._FATAL


def _fatal(error: KafkaError, what: str, url: str) -> BufferUnavailable:
    return BufferUnavailable(
        f"Kafka buffer {url}: the {what} stopped after a fatal error ({_reason(error)}); "
        f"close this {what} and open a new one"
    )


def _reason(error: object) -> str:
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return str(error)


# -- producing ---------------------------------------------------------------------------

# A record the producer or the brokers refuse for its size: refused again on every try.
_TOO_LARGE = (KafkaError.MSG_SIZE_TOO_LARGE,)
_SIZE_ADVICE = (
    "A record is one step: send smaller observations, set compression: zstd, or raise the "
    "limits (the brokers' message.max.bytes or the topic's max.message.bytes, and "
    "producer.message.max.bytes in the buffer URL)."
)


class _RefusedForSize(Exception):
    """The client refused one record for its size (raised inside ``publish`` only)."""

    def __init__(self, size: int, error: KafkaException) -> None:
        super().__init__(size, error)
        self.size = size
        self.error = error


def _code(error: KafkaException) -> object:
    first = error.args[0] if error.args else None
    return first.code() if isinstance(first, KafkaError) else None


class KafkaProducer:
    """Publishes steps keyed by episode; back-pressure on consumer lag (module docstring).
    Use it from one thread (librdkafka's own threads do the sending)."""

    def __init__(self, url: str, options: BufferOptions) -> None:
        self._topic = _Topic(url, options)
        self.options = options
        self.groups = self._topic.target.groups
        self.counts = ProducerCounts()
        self.undelivered: list[Record] = []  # steps Kafka never stored: republish them
        self.failed = 0  # deliveries that failed, ever
        self._unreported: list[KafkaError] = []  # failures the caller has not been told of
        self._refused: list[KafkaError] = []  # records refused for their size, not yet told
        self._brokers_down: KafkaError | None = None  # every broker down, said the client
        self._fatal: KafkaError | None = None  # the client cannot go on
        self._produced = 0  # records handed to the client, ever
        self._measured: tuple[float, int, int] | None = None  # when, pending, _produced then
        self._last_pending = 0  # the last measurement, for messages
        self._closed = False
        layers: list[dict[str, Any]] = [PRODUCER_DEFAULTS, {"error_cb": self._on_error}]
        if options.compression:
            layers.append({"compression.type": options.compression})
        self._producer: confluent_kafka.Producer = self._topic.client(
            confluent_kafka.Producer, self._topic.config(*layers, self._topic.target.producer)
        )

    # -- the interface

    def publish(self, steps: Sequence[Record]) -> None:
        """Hand ``steps`` to the client (keyed by episode, so each episode's order holds).
        Waits up to ``publish_timeout_s`` for room (``pending() + len(steps) <=
        max_pending``, or an empty buffer), then raises :class:`BufferFull` or drops and
        counts them (``overflow``). Should the client's own queue stay full mid-batch (its
        byte limit), the steps before are published and the rest raise or are dropped, the
        message saying how many. Raises :class:`BufferUnavailable` first when earlier steps
        failed to be delivered (see :attr:`undelivered`), :class:`RecordTooLarge` when a
        record is over the producer's ``message.max.bytes`` or the brokers refused earlier
        ones for their size: permanent, so not worth a retry."""
        self._report_failures()
        if self._fatal is not None:
            raise _fatal(self._fatal, "producer", self._topic.target.url)
        if not steps:
            return
        deadline = time.monotonic() + self.options.publish_timeout_s
        if not self._wait_for_room(len(steps), deadline):
            self._full(len(steps))
            return
        for done, step in enumerate(steps):
            try:
                produced = self._produce(step, deadline)
            except _RefusedForSize as refused:
                raise self._too_large_to_send(step, refused, done, len(steps)) from refused
            if not produced:  # the client's own queue stayed full
                self._full(len(steps) - done)
                return
        self._producer.poll(0)

    def pending(self) -> int:
        """Records not yet committed by the URL's groups, plus this producer's queue (its
        queue alone without ``group``): see the module's docstring."""
        self._producer.poll(0)
        return self._measure(self._topic.target.timeout_s)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the brokers acknowledged every step; :class:`BufferUnavailable` when
        some are still unacknowledged after ``timeout_s`` or failed, :class:`RecordTooLarge`
        when the brokers refused some for their size (those are not republished)."""
        left = self._producer.flush(timeout_s)
        self._report_failures()
        if left:
            raise self._topic.unavailable(
                "flushing",
                f"{left} steps not acknowledged after {timeout_s:g} s (the client keeps "
                "retrying them until message.timeout.ms)",
            )

    def close(self) -> None:
        """Flush (``timeout_s`` of the URL), then release the client. Raises like ``flush``
        when steps could not be delivered; closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        self.flush(self._topic.target.timeout_s)

    def take_undelivered(self) -> list[Record]:
        """The steps Kafka never stored, in the order they failed; forgotten here."""
        steps, self.undelivered = self.undelivered, []
        return steps

    # -- internals

    def _produce(self, step: Record, deadline: float) -> bool:
        """One record into the client's queue, polling while the queue is full; False when
        it stayed full until ``deadline``."""
        value, key = encode(step), step.stream.encode()
        callback = partial(self._on_delivery, step)
        while True:
            try:
                self._producer.produce(self._topic.target.topic, value, key, on_delivery=callback)
            except BufferError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._producer.poll(min(WAIT_SLICE_S, remaining))
                continue
            except KafkaException as error:  # fatal: e.g. idempotence the broker lacks
                if _code(error) in _TOO_LARGE:
                    raise _RefusedForSize(len(value), error) from error
                raise self._topic.unavailable("publishing", error) from error
            self.counts.published += 1
            self._produced += 1
            return True

    def _wait_for_room(self, count: int, deadline: float) -> bool:
        limit = self.options.max_pending
        pending = self._estimate()
        while pending + count > limit and pending > 0:
            if time.monotonic() >= deadline:
                return False
            self._producer.poll(min(WAIT_SLICE_S, max(0.0, deadline - time.monotonic())))
            if self._brokers_down is not None and not self.groups:
                pending = self._measure(0)  # our queue alone: no broker answer needed
            else:
                pending = self._measure(max(0.1, deadline - time.monotonic()))
        return True

    def _estimate(self) -> int:
        """The last measurement plus what was produced since; measured afresh when older
        than ``MEASURE_EVERY_S`` or when it would not leave room."""
        if self._measured is None or time.monotonic() - self._measured[0] > MEASURE_EVERY_S:
            return self._measure(self._topic.target.timeout_s)
        _, pending, produced = self._measured
        estimate = pending + self._produced - produced
        if estimate >= self.options.max_pending:
            return self._measure(self._topic.target.timeout_s)
        return estimate

    def _measure(self, timeout_s: float) -> int:
        queued = len(self._producer)
        lag = self._topic.lag(self.groups, timeout_s) if self.groups else 0
        pending = lag + queued
        self._measured = (time.monotonic(), pending, self._produced)
        self._last_pending = pending
        return pending

    def _too_large_to_send(
        self, step: Record, refused: _RefusedForSize, done: int, steps: int
    ) -> RecordTooLarge:
        config = {**self._topic.target.common, **self._topic.target.producer}
        limit = config.get("message.max.bytes", "1000000")
        return RecordTooLarge(
            f"Kafka buffer {self._topic.target.url}: step {step.key}'s record is "
            f"{refused.size:,} bytes, more than the producer's message.max.bytes ({limit}): "
            f"{_reason(refused.error)}. The {done} steps before it in this publish were "
            f"published, it and the {steps - done - 1} after it were not. {_SIZE_ADVICE}"
        )

    def _full(self, steps: int) -> None:
        if self._brokers_down is not None:
            raise self._topic.unavailable("publishing", self._brokers_down)
        where = f"Kafka topic {self._topic.target.topic!r} at {self._topic.target.url}"
        overflow(self.options, self.counts, steps, where, self._last_pending)

    def _on_delivery(self, step: Record, error: KafkaError | None, _message: Any) -> None:
        if error is None:
            self._brokers_down = None
            return
        self.counts.published -= 1
        self.failed += 1
        if error.code() in _TOO_LARGE:  # never stored, whatever is tried: not republished
            self._refused.append(error)
        else:
            self.undelivered.append(step)
            self._unreported.append(error)
        log.error("kafka: step %s was not delivered: %s", step.key, _reason(error))

    def _on_error(self, error: KafkaError) -> None:
        _log_client_error(f"producer ({self._topic.target.url})", error)
        if _is_fatal(error):
            self._fatal = error
        elif error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._brokers_down = error

    def _report_failures(self) -> None:
        if self._refused:  # permanent: before the transient ones, which wait their turn
            refused, self._refused = self._refused, []
            raise RecordTooLarge(
                f"Kafka buffer {self._topic.target.url}: the brokers refused {len(refused)} "
                f"published steps as too large ({_reason(refused[-1])}); they are lost (not "
                f"counted as published, and not republished: they would be refused again). "
                f"{_SIZE_ADVICE}"
            )
        if not self._unreported:
            return
        failures, self._unreported = self._unreported, []
        raise BufferUnavailable(
            f"Kafka buffer {self._topic.target.url}: {len(failures)} published steps were not "
            f"delivered ({_reason(failures[-1])}); they are not counted as published and wait "
            "in producer.undelivered: republish them with "
            "producer.publish(producer.take_undelivered()) once the brokers are back."
        )


# -- consuming ---------------------------------------------------------------------------


class KafkaConsumer:
    """A consumer named ``name`` in consumer group ``group``, with static membership; see
    the module's docstring for what it guarantees. Use it from one thread."""

    def __init__(self, url: str, group: str, name: str, options: BufferOptions) -> None:
        self.group = check_group_name(group)  # librdkafka aborts the process on ""
        self._topic = _Topic(url, options)
        self.name = name
        self.counts = ConsumerCounts()
        self._reader = RecordReader(options, self.counts, log)
        self._committed: dict[int, int] = {}  # partition -> next offset this consumer committed
        self._read_to: dict[int, int] = {}  # partition -> the last offset read (skipped too)
        # Poison records, by (partition, the offset read just before): committed with it.
        self._skipped_after: dict[tuple[int, int], int] = {}
        self._brokers_down: KafkaError | None = None  # every broker down, said the client
        self._fatal: KafkaError | None = None  # the client cannot go on
        self._closed = False
        ours = {
            "group.id": group,
            "client.id": name,
            "group.instance.id": name,
            "error_cb": self._on_error,
        }
        config = self._topic.config(CONSUMER_DEFAULTS, ours, self._topic.target.consumer)
        if not config.get("group.instance.id"):  # consumer.group.instance.id= : dynamic
            config.pop("group.instance.id")
        self._consumer: confluent_kafka.Consumer = self._topic.client(
            confluent_kafka.Consumer, config
        )
        self._consumer.subscribe([self._topic.target.topic])

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        """Up to ``max_records`` deliveries: what the client has fetched already, else
        waiting up to ``timeout_s`` for the first (joining the group on the first calls).
        Each partition's records come in offset order, from the group's committed offset."""
        if self._fatal is not None:
            raise self._consumer_error(self._fatal)
        if max_records <= 0:
            return []
        if self._brokers_down is not None:
            self._check_brokers()
        messages = self._consume(max_records, 0)
        if not messages and timeout_s > 0:
            messages = self._consume(1, timeout_s)
            if messages and max_records > 1:
                messages += self._consume(max_records - 1, 0)
        deliveries = [d for d in map(self._delivery, messages) if d is not None]
        self.counts.delivered += len(deliveries)
        return deliveries

    def commit(self, deliveries: Sequence[Delivery]) -> None:
        """Commit, synchronously, the highest offset + 1 per partition among
        ``deliveries``. A commit refused because the group rebalanced is logged and not
        counted (those records are delivered again); other failures raise
        :class:`BufferUnavailable` (nothing is lost: commit again, or they come again)."""
        if self._fatal is not None:
            raise self._consumer_error(self._fatal)
        if not deliveries:
            return
        highest: dict[int, int] = {}
        for delivery in deliveries:
            partition, offset = delivery.position
            highest[partition] = max(offset, highest.get(partition, -1))
        for partition, offset in highest.items():  # and the poison records right after
            while (partition, offset) in self._skipped_after:
                offset = highest[partition] = self._skipped_after.pop((partition, offset))
        # Poison records these positions passed: nothing is left to carry them.
        self._skipped_after = {
            (p, o): after for (p, o), after in self._skipped_after.items() if o > highest.get(p, -1)
        }
        self._commit_highest(highest, deliveries)

    def _commit_highest(self, highest: dict[int, int], deliveries: Sequence[Delivery]) -> None:
        topic = self._topic.target.topic
        offsets = [TopicPartition(topic, p, o + 1) for p, o in sorted(highest.items())]
        try:
            answer = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as error:
            self._commit_failed(error.args[0] if error.args else error, deliveries)
            return
        refused = [tp for tp in answer or [] if tp.error is not None]
        if refused:
            self._commit_failed(refused[0].error, deliveries)
            return
        self.counts.add_committed(self._newly_committed(deliveries))
        for partition, offset in highest.items():
            self._committed[partition] = max(offset + 1, self._committed.get(partition, 0))

    def close(self) -> None:
        """Leave the group (``unsubscribe``: a static member leaves only so), so the
        partitions move to the group's other consumers at once; uncommitted records are
        delivered again. Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._fatal is None:  # else the client can no longer leave: just release it
            try:
                self._consumer.unsubscribe()
                self._serve_revocation(deadline=time.monotonic() + LEAVE_TIMEOUT_S)
            except (KafkaException, RuntimeError) as error:
                log.warning("kafka consumer %s: leaving failed: %s", self.name, _reason(error))
        self._consumer.close()

    def assigned_partitions(self) -> list[int]:
        """The partitions this consumer holds now (after a ``poll`` joined the group)."""
        return sorted(tp.partition for tp in self._consumer.assignment())

    # -- internals

    def _serve_revocation(self, deadline: float) -> None:
        """Poll until the client has given up its partitions: only then does it send the
        LeaveGroup (closing before that, a static member stays in the group). What comes
        meanwhile is dropped: it was not committed, so it comes again."""
        while self._consumer.assignment() and time.monotonic() < deadline:
            self._consumer.consume(100, 0.01)

    def _consume(self, count: int, timeout_s: float) -> list[Any]:
        try:
            messages: list[Any] = self._consumer.consume(count, timeout_s)
        except KafkaException as error:
            raise self._topic.unavailable(f"polling as {self.name!r}", error) from error
        good = []
        for message in messages:
            problem = message.error()
            if problem is None:
                good.append(message)
            elif problem.code() != KafkaError._PARTITION_EOF:
                self._on_error(problem)
                if _is_fatal(problem) or problem.code() in _FATAL_FOR_CONSUMER:
                    raise self._consumer_error(problem)
        if good:
            self._brokers_down = None
        return good

    def _delivery(self, message: Any) -> Delivery | None:
        partition, offset = message.partition(), message.offset()
        step = self._reader.read(
            message.value() or b"",
            compressed=False,
            where=lambda: f"kafka topic {message.topic()} partition {partition} offset {offset}",
        )
        before = self._read_to.get(partition)
        self._read_to[partition] = offset
        if step is None:
            self._skip(partition, before, offset)
            return None
        return Delivery(step, (partition, offset))

    def _skip(self, partition: int, before: int | None, offset: int) -> None:
        """A poison record at ``offset``: committed at once when every record read before it
        is (or none was: the group's committed offset is where reading began), else with
        the delivery at ``before``."""
        if before is None or self._committed.get(partition, 0) > before:
            self._commit_highest({partition: offset}, [])
        else:
            self._skipped_after[(partition, before)] = offset

    def _newly_committed(self, deliveries: Iterable[Delivery]) -> list[Record]:
        seen: set[tuple[int, int]] = set()
        steps = []
        for delivery in deliveries:
            partition, offset = delivery.position
            if offset >= self._committed.get(partition, 0) and delivery.position not in seen:
                seen.add(delivery.position)
                steps.append(delivery.step)
        return steps

    def _commit_failed(self, error: Any, deliveries: Sequence[Delivery]) -> None:
        code = error.code() if isinstance(error, KafkaError) else None
        if code == KafkaError._NO_OFFSET:
            return
        if code in _REBALANCED:
            log.warning(
                "kafka consumer %s: commit of %d deliveries refused after a rebalance (%s); "
                "their partitions' new owner gets them again",
                self.name,
                len(deliveries),
                _reason(error),
            )
            return
        if code == KafkaError.FENCED_INSTANCE_ID:
            raise self._consumer_error(error)
        raise self._topic.unavailable(
            f"committing {len(deliveries)} deliveries as {self.name!r}", error
        )

    def _consumer_error(self, error: KafkaError) -> Exception:
        fenced = error.code() == KafkaError.FENCED_INSTANCE_ID or "fenced" in error.str()
        if fenced:
            return BufferUnavailable(
                f"Kafka buffer {self._topic.target.url}: another consumer named {self.name!r} "
                f"joined group {self.group!r} and fenced this one ({_reason(error)}); give "
                "every running consumer of a group its own name"
            )
        if error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
            return ConfigError(
                f"data_buffer {self._topic.target.url!r}: the brokers refused the session "
                f"timeout ({_reason(error)}); set consumer.session.timeout.ms within the "
                "brokers' group.min/max.session.timeout.ms (usually 6000 to 300000)"
            )
        if _is_fatal(error):
            return _fatal(error, "consumer", self._topic.target.url)
        return self._topic.unavailable(f"polling as {self.name!r}", error)

    def _on_error(self, error: KafkaError) -> None:
        _log_client_error(f"consumer {self.name} ({self._topic.target.url})", error)
        if _is_fatal(error):
            self._fatal = error
        elif error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._brokers_down = error

    def _check_brokers(self) -> None:
        """After the client said every broker is down: a metadata request decides whether
        they are back (the client does not say so itself)."""
        try:
            self._consumer.list_topics(timeout=min(self._topic.target.timeout_s, 2.0))
        except KafkaException as error:
            down = self._brokers_down
            raise self._topic.unavailable(f"polling as {self.name!r}", down or error) from error
        self._brokers_down = None


_FATAL_FOR_CONSUMER = (
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.INVALID_SESSION_TIMEOUT,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
)
