"""``memory://NAME``: an in-process buffer for a co-located trainer and its rollout workers.

Producers and consumers that open the same NAME in one process share one buffer (a
module-level registry); nothing crosses a process boundary, so a killed process takes its
buffer with it. Thread-safe: one lock and one condition guard everything, so workers may
publish from threads while the trainer polls.

Guarantees (``loop.buffers.base``): each consumer group has its own read position over the
one sequence of published records, so order within an episode is kept for a group's
single consumer. Deliveries a consumer has not committed when it closes go back to the
front of its group (at least once). ``pending()`` counts records published and not yet
committed by the slowest group; before any group exists, everything published is pending.
Records every group has committed are released.

Records are held as objects, not encoded: their arrays are copied once at publish (a worker
may reuse its buffers) and made read-only, as a decoded record's are. ``compression`` is
ignored: nothing travels over a link.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kernel.errors import ConfigError
from loop.buffers.base import (
    BufferOptions,
    ConsumerCounts,
    Delivery,
    ProducerCounts,
    overflow,
)
from loop.experience import Record

_registry: dict[str, _Buffer] = {}
_registry_lock = threading.Lock()


@dataclass
class _Group:
    next: int = 0  # the first offset never delivered to this group
    returned: list[int] = field(default_factory=list)  # redeliver first (sorted)
    outstanding: dict[int, set[int]] = field(default_factory=dict)  # consumer id -> offsets
    committed: int = 0

    def low(self) -> int:
        """The first offset this group may still need."""
        held = [min(s) for s in self.outstanding.values() if s]
        return min([self.next, *self.returned[:1], *held])


class _Buffer:
    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.records: list[Record] = []  # by offset - base: O(1) reads anywhere
        self.base = 0  # the offset of records[0]
        self.published = 0
        self.groups: dict[str, _Group] = {}

    def pending(self) -> int:
        if not self.groups:
            return self.published
        return self.published - min(g.committed for g in self.groups.values())

    def release(self) -> None:
        """Drop records every group has committed (in slices, amortised O(1) a record)."""
        done = min(g.low() for g in self.groups.values()) - self.base
        if done >= 1024 or 2 * done >= len(self.records) > 0:
            del self.records[:done]
            self.base += done


def buffer(url: str) -> _Buffer:
    """The buffer named by ``memory://NAME`` in this process (created on first use)."""
    name = _name(url)
    with _registry_lock:
        return _registry.setdefault(name, _Buffer())


def discard(url: str) -> None:
    """Forget the buffer named by ``url`` (its open producers and consumers keep theirs)."""
    name = _name(url)
    with _registry_lock:
        _registry.pop(name, None)


def _name(url: str) -> str:
    parts = urlsplit(url)
    name = (parts.netloc + parts.path).strip("/")
    if parts.scheme != "memory" or not name:
        raise ConfigError(f"data_buffer {url!r}: write an in-process buffer as memory://NAME")
    return name


class MemoryProducer:
    def __init__(self, url: str, options: BufferOptions) -> None:
        self.url = url
        self.options = options
        self.counts = ProducerCounts()
        self._buffer = buffer(url)

    def publish(self, steps: Sequence[Record]) -> None:
        """Append all of ``steps`` or none: waits up to ``publish_timeout_s`` for room."""
        if not steps:
            return
        owned = [s.owned() for s in steps]
        n, limit = len(owned), self.options.max_pending
        buf = self._buffer
        with buf.cond:
            if n > limit or not buf.cond.wait_for(
                lambda: buf.pending() + n <= limit, self.options.publish_timeout_s
            ):
                overflow(self.options, self.counts, n, self.url, buf.pending())
                return
            buf.records.extend(owned)
            buf.published += n
            self.counts.published += n
            buf.cond.notify_all()

    def pending(self) -> int:
        with self._buffer.cond:
            return self._buffer.pending()

    def flush(self, timeout_s: float = 10.0) -> None:
        """Nothing to wait for: a publish is stored when it returns."""

    def close(self) -> None:
        pass


class MemoryConsumer:
    def __init__(self, url: str, group: str, name: str, options: BufferOptions) -> None:
        self.url = url
        self.name = name
        self.options = options
        self.counts = ConsumerCounts()
        self._buffer = buffer(url)
        self._id = id(self)
        with self._buffer.cond:
            # A group joining late starts at the oldest record still held.
            base = self._buffer.base
            self._group = self._buffer.groups.setdefault(group, _Group(base, committed=base))
            self._group.outstanding[self._id] = set()
        self._closed = False

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        """Up to ``max_records``: the group's returned deliveries first, then new records."""
        buf, group = self._buffer, self._group
        with buf.cond:
            self._check_open()
            buf.cond.wait_for(lambda: bool(group.returned) or group.next < buf.published, timeout_s)
            take = group.returned[:max_records]
            del group.returned[: len(take)]
            fresh = min(max_records - len(take), buf.published - group.next)
            take.extend(range(group.next, group.next + fresh))
            group.next += fresh
            group.outstanding[self._id].update(take)
            deliveries = [Delivery(buf.records[o - buf.base], o) for o in take]
        self.counts.delivered += len(deliveries)
        return deliveries

    def commit(self, deliveries: Sequence[Delivery]) -> None:
        """Commit each delivery this consumer holds (others, or repeats, are ignored)."""
        buf, group = self._buffer, self._group
        with buf.cond:
            self._check_open()
            mine = group.outstanding[self._id]
            done = [d for d in deliveries if d.position in mine]
            mine.difference_update(d.position for d in done)
            group.committed += len(done)
            buf.release()
            buf.cond.notify_all()
        self.counts.add_committed(d.step for d in done)

    def close(self) -> None:
        """Give this consumer's uncommitted deliveries back to the front of its group."""
        with self._buffer.cond:
            if self._closed:
                return
            self._closed = True
            held = self._group.outstanding.pop(self._id)
            self._group.returned = sorted([*self._group.returned, *held])
            self._buffer.cond.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"consumer {self.name!r} of {self.url} is closed: open a new one")
