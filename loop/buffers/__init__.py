"""Experience buffers, chosen by URL (``data_buffer`` in the loop's configuration):

    memory://NAME                      in-process queue: a co-located trainer in the same process
    file:///path/to/dir                an append-only local log: separate processes, one machine
    redis://host:6379/0?stream=NAME    Redis Streams with a consumer group
    kafka://host:9092/TOPIC?partitions=16   Kafka, keyed by episode, with a consumer group

``open_producer`` and ``open_consumer`` return the backend's implementation of
``loop.buffers.base.Producer`` / ``Consumer``; the backends import their client library
only when chosen.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from kernel.errors import ConfigError
from loop.buffers.base import BufferOptions, Consumer, Producer

SCHEMES = ("memory", "file", "redis", "kafka")


def open_producer(url: str, options: BufferOptions | None = None) -> Producer:
    scheme = _scheme(url)
    options = options or BufferOptions()
    if scheme == "memory":
        from loop.buffers.memory import MemoryProducer

        return MemoryProducer(url, options)
    if scheme == "file":
        from loop.buffers.local_log import LogProducer

        return LogProducer(url, options)
    if scheme == "redis":
        from loop.buffers.redis_streams import RedisProducer

        return RedisProducer(url, options)
    from loop.buffers.kafka import KafkaProducer

    return KafkaProducer(url, options)


def open_consumer(
    url: str, group: str, name: str, options: BufferOptions | None = None
) -> Consumer:
    """A consumer named ``name`` in consumer group ``group`` (restart it under the same
    name to get its uncommitted deliveries again)."""
    scheme = _scheme(url)
    options = options or BufferOptions()
    if scheme == "memory":
        from loop.buffers.memory import MemoryConsumer

        return MemoryConsumer(url, group, name, options)
    if scheme == "file":
        from loop.buffers.local_log import LogConsumer

        return LogConsumer(url, group, name, options)
    if scheme == "redis":
        from loop.buffers.redis_streams import RedisConsumer

        return RedisConsumer(url, group, name, options)
    from loop.buffers.kafka import KafkaConsumer

    return KafkaConsumer(url, group, name, options)


def _scheme(url: str) -> str:
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise ConfigError(
            f"data_buffer {url!r}: unknown kind {scheme!r}; use one of "
            "memory://NAME, file:///DIR, redis://HOST:PORT/DB?stream=NAME, "
            "kafka://HOST:PORT/TOPIC?partitions=N"
        )
    return scheme
