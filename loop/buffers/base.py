"""The one small interface every experience buffer implements.

A :class:`Producer` appends steps; a :class:`Consumer` in a consumer group polls them and
commits what it has processed. The guarantees every backend gives (and the shared
contract tests in ``tests/loop/buffers/contract.py`` check against real servers):

- **Order within an episode**: steps of one episode are delivered in the order published
  (Kafka: keyed by episode, so one episode stays in one partition).
- **At least once**: a delivery not committed is delivered again, to the next consumer of
  the group that starts (same ``name``: its own uncommitted deliveries first), so a
  consumer killed mid-batch loses nothing. Duplicates are dropped by the consumer with
  ``loop.experience.Deduplicator``, keyed by ``Record.key``.
- **Bounded**: a producer sees back-pressure once ``max_pending`` records are published and
  not yet committed: ``publish`` waits up to ``publish_timeout_s`` for room, then raises
  :class:`BufferFull` (``overflow: block``) or drops the steps and counts them
  (``overflow: drop``). Nothing is dropped silently.
- **Transient or permanent**: :class:`BufferFull` and :class:`BufferUnavailable` may pass
  (retry the same records); :class:`RecordTooLarge` never does (retrying cannot help).
- **Accounting**: ``published`` + ``dropped`` on the producer side, ``delivered`` and
  ``committed`` on the consumer side; published = committed + still buffered.
- **Poison records are skipped**: a record a consumer cannot decode (bytes that are not an
  experience record, or that decompress beyond ``max_record_bytes``) is never delivered:
  :class:`RecordReader` logs it with its position, counts it in ``undecodable``, and the
  backend acknowledges it (Redis: after copying it to ``<stream>-dead``; ``file://`` and
  Kafka: with the next commit, which is cumulative), so the records around it are
  delivered and it never comes again once they are committed.
- **One rule for group names** (``loop.group_names``): ``file://`` and Kafka take the same
  ones as the loop config, and refuse others (:class:`~kernel.errors.ConfigError`) before
  any server is asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from kernel.errors import ConfigError, PayloadTooLarge, QueueFull, ServiceUnavailable
from loop.experience import Record, decode

MAX_RECORD_BYTES = 64 << 20  # one encoded record, decompressed, at most


class Overflow(StrEnum):
    """What a producer does when the buffer stays full for ``publish_timeout_s``."""

    BLOCK = "block"  # raise BufferFull: the caller decides (a rollout worker waits)
    DROP = "drop"  # drop the steps, counted in ``dropped``


@dataclass(frozen=True, slots=True)
class BufferOptions:
    max_pending: int = 100_000  # records published and not yet committed, before back-pressure
    overflow: Overflow = Overflow.BLOCK
    publish_timeout_s: float = 5.0
    compression: str | None = None  # "zstd" or None: compress records for congested links
    max_record_bytes: int = MAX_RECORD_BYTES  # a consumer skips a record that decodes larger

    def __post_init__(self) -> None:
        if self.max_pending < 1:
            raise ConfigError(f"max_pending must be at least 1, got {self.max_pending}")
        if self.max_record_bytes < 1:
            raise ConfigError(f"max_record_bytes must be at least 1, got {self.max_record_bytes}")
        if self.publish_timeout_s < 0:
            raise ConfigError(f"publish_timeout_s must be >= 0, got {self.publish_timeout_s}")
        if self.overflow not in tuple(Overflow):
            raise ConfigError(f"overflow {self.overflow!r}: use 'block' or 'drop'")
        object.__setattr__(self, "overflow", Overflow(self.overflow))
        if self.compression not in (None, "zstd"):
            raise ConfigError(f"compression {self.compression!r}: use 'zstd' or leave it unset")


class BufferFull(QueueFull):
    """The buffer held ``max_pending`` records for the whole ``publish_timeout_s``."""


class BufferUnavailable(ServiceUnavailable):
    """The buffer's server cannot be reached (or the local log cannot be written)."""


class RecordTooLarge(PayloadTooLarge):
    """The buffer refused records for their size (Kafka's ``MSG_SIZE_TOO_LARGE``): a
    permanent refusal, unlike :class:`BufferFull` and :class:`BufferUnavailable`: publishing
    the same records again can never succeed, so it is not retried."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """A step as a consumer received it, with the backend's position for ``commit``."""

    step: Record
    position: Any  # a Kafka (partition, offset), a Redis stream id, a log offset


@dataclass(slots=True)
class ProducerCounts:
    published: int = 0
    dropped: int = 0


@dataclass(slots=True)
class ConsumerCounts:
    delivered: int = 0  # redeliveries included
    committed: int = 0
    undecodable: int = 0  # poison records skipped (RecordReader)
    by_version: dict[int, int] = field(default_factory=dict)  # committed steps per version

    def add_committed(self, steps: Iterable[Record]) -> None:
        for step in steps:
            self.committed += 1
            self.by_version[step.model_version] = self.by_version.get(step.model_version, 0) + 1


class RecordReader:
    """A consumer's one way from a buffer's bytes to a record: zstd-decompressed within
    ``max_record_bytes`` (a frame that says it is larger is refused before anything is
    decompressed), then decoded. Bytes that are not a record give None, once logged with
    their position (``where()``, asked only then) and counted in ``counts.undecodable``:
    the consumer skips them and delivers the rest."""

    def __init__(self, options: BufferOptions, counts: ConsumerCounts, log: logging.Logger):
        self.limit = options.max_record_bytes
        self.counts = counts
        self.log = log
        self._zstd: Any = None
        self._decompressor: Any = None  # made at the first compressed record, then reused

    def read(self, data: bytes, *, compressed: bool, where: Callable[[], str]) -> Record | None:
        try:
            return decode(self._decompressed(data) if compressed else self._bounded(data))
        except (ValueError, TypeError) as error:  # msgpack's errors are ValueErrors
            self.skipped(where(), str(error))
            return None

    def skipped(self, where: str, why: str, *, records: int = 1) -> None:
        """Count and log records the consumer skips."""
        self.counts.undecodable += records
        self.log.error(
            "%s is not an experience record (%s); skipped (%d so far): publish only through "
            "loop.buffers",
            where,
            why,
            self.counts.undecodable,
        )

    def _bounded(self, data: bytes) -> bytes:
        if len(data) > self.limit:
            raise ValueError(f"{len(data)} bytes, more than max_record_bytes {self.limit}")
        return data

    def _decompressed(self, data: bytes) -> bytes:
        if self._zstd is None:
            import zstandard

            self._zstd = zstandard
            self._decompressor = zstandard.ZstdDecompressor()
        try:
            declared = self._zstd.frame_content_size(data)  # -1: the frame does not say
            if declared > self.limit:
                raise ValueError(
                    f"decompresses to {declared} bytes, more than max_record_bytes {self.limit}"
                )
            # Bounded where the frame does not declare its size; where it does, zstd
            # checks the frame against it.
            out = self._decompressor.decompress(data, max_output_size=self.limit)
        except self._zstd.ZstdError as error:
            raise ValueError(f"not a zstd frame within max_record_bytes: {error}") from None
        return bytes(out)


def overflow(
    options: BufferOptions, counts: ProducerCounts, steps: int, where: str, pending: int
) -> None:
    """What a producer does once the buffer stayed full for ``publish_timeout_s``: count
    the steps as dropped (``overflow: drop``) or raise :class:`BufferFull`."""
    if options.overflow == Overflow.DROP:
        counts.dropped += steps
        return
    raise BufferFull(
        f"experience buffer {where} held {pending} records (max_pending="
        f"{options.max_pending}) for {options.publish_timeout_s}s, {steps} more did not fit: "
        "the trainer is not keeping up; add consumers, raise max_pending, or set "
        "overflow: drop"
    )


class Producer(Protocol):
    counts: ProducerCounts

    def publish(self, steps: Sequence[Record]) -> None:
        """Append ``steps`` (order kept within each episode); back-pressure as above."""
        ...

    def pending(self) -> int:
        """Records published to this buffer and not yet committed by its consumers."""
        ...

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every published step is stored by the buffer."""
        ...

    def close(self) -> None: ...


class Consumer(Protocol):
    counts: ConsumerCounts

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        """Up to ``max_records`` deliveries, waiting up to ``timeout_s`` for the first;
        after a restart, this consumer's uncommitted deliveries come first."""
        ...

    def commit(self, deliveries: Sequence[Delivery]) -> None:
        """Mark ``deliveries`` processed: they are never delivered to this group again.

        Commits may be cumulative: on the offset-based backends (``file://``, Kafka per
        partition) committing a delivery also commits every earlier one. Commit in the
        order ``poll`` delivered (``loop.controller.SyncController`` does), never a later
        delivery before an earlier one that is still being processed."""
        ...

    def close(self) -> None:
        """Leave the group; uncommitted deliveries will be delivered again."""
        ...
