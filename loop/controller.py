"""The sync controller: the trainer-side consumer of an experience buffer, which bounds
the staleness of what the trainer learns from.

Staleness is counted in published policy versions: a record chosen by version ``v`` and
used by a trainer whose last published version is ``V`` has staleness ``V - v``. The
trainer tells the controller its version (:meth:`SyncController.set_version`); the
controller polls the buffer, drops redeliveries (:class:`~loop.experience.Deduplicator`),
and treats every record whose staleness exceeds ``max_staleness`` as the
:class:`Fallback` says: drop it, route it to an offline buffer, or keep it, marked.

Guarantees:

- **Bounded staleness**: with ``max_staleness=k`` and ``DROP`` or ``OFFLINE``, no step in a
  returned :class:`Batch` has ``batch.version - step.model_version > k``, where
  ``batch.version`` is the trainer's version when the batch is returned (checked again at
  return: the version may move while the controller polls). With ``KEEP`` such steps are
  returned, and ``batch.staleness`` / :meth:`Batch.stale` mark them.
- **At least once**: a returned batch is committed only by :meth:`SyncController.commit`,
  after the trainer has used it; a trainer that dies before that gets its records again.
  Records the controller handles itself (dropped, routed, duplicates) are committed by the
  controller, at the latest with the trainer's next ``commit`` or ``next_batch``: a routed
  record only after the offline producer has it (published, then flushed), never before;
  a duplicate only once its original is done (a batch: committed by the trainer).
  Commits go to the buffer strictly in poll order (a delivery is committed once it and
  every delivery polled before it are done), so backends whose commits are cumulative
  offsets (``file://``, Kafka) never commit a batch the trainer still holds.
- **Nothing is lost on an error**: records taken from the consumer and not yet returned
  or handled when something raises (a full offline buffer) are kept and handled first by
  the next :meth:`SyncController.next_batch`.
- **Accounting balances** (:class:`Accounting`): every record taken from the buffer is
  exactly one of consumed, dropped, routed, from the future, or a duplicate of one of those.
- **No record from the future**: a record stamped with a version newer than the trainer's
  (negative staleness: a server another trainer pushed to, or a forged stamp) is an error,
  whatever the bound and fallback: logged, counted (``from_future``,
  ``rl_experience_from_future_total``) and dropped, never returned.

Admission control: workers cannot run further ahead of the trainer than the buffer holds.
A buffer's ``max_pending`` (``loop.buffers.base.BufferOptions``) blocks producers once that
many records are published and not committed; a record waits at most about
``max_pending / R`` versions in the buffer, where ``R`` is the records the trainer commits
per published version. Setting ``max_pending <= max_staleness * R`` keeps most records
within the bound by back-pressure, so the fallback handles only stragglers (a worker slow
to pick up new weights, or one that held an episode for long). :meth:`SyncController.lag`
reports the buffer's pending records for a trainer to watch.

Threads: :meth:`next_batch` and :meth:`commit` belong to one thread (or are serialised by
the caller); :meth:`set_version` may be called from any thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from typing_extensions import TypeVar

from kernel.errors import ConfigError
from loop.buffers.base import Consumer, Delivery, Producer
from loop.experience import Completion, Deduplicator, Record, Step

log = logging.getLogger(__name__)

# Versions: Fibonacci, fine where staleness is small and coarse where it is large.
STALENESS_BUCKETS = (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987)
# Seconds from the server's answer to the trainer: milliseconds (embedded) to minutes (backlog).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


class Fallback(StrEnum):
    """What happens to a record whose staleness exceeds ``max_staleness``
    (``sync_policy.fallback_strategy`` in the loop's configuration)."""

    DROP = "drop"  # counted in ``dropped`` and committed
    OFFLINE = "offline"  # published to the offline buffer, then committed
    KEEP = "keep"  # returned to the trainer, marked (``Batch.staleness``)


R = TypeVar("R", bound=Step | Completion, default=Step)  # the records a trainer learns from


@dataclass(frozen=True, slots=True)
class Batch(Generic[R]):
    """Up to ``size`` new records for the trainer (steps, or a language model's
    completions), in the order the buffer delivered them.

    ``staleness[i] = version - steps[i].model_version``, measured when the batch was
    returned; the behaviour policy's log-prob is ``steps[i].log_prob``, so an
    importance-weighted learner has what it needs for ``pi(a|s) / mu(a|s)``. Hand the
    batch back to :meth:`SyncController.commit` once it has been used."""

    steps: list[R]  # the records: environment steps, or completions
    staleness: list[int]
    version: int  # the trainer's version the batch was checked against
    max_staleness: int | None
    deliveries: list[Delivery]  # the buffer's deliveries of ``steps``
    id: int  # unique per controller: what ``commit`` looks up

    def __len__(self) -> int:
        return len(self.steps)

    def stale(self) -> list[bool]:
        """Per step: over ``max_staleness`` (only ever True under ``Fallback.KEEP``)."""
        k = self.max_staleness
        return [k is not None and s > k for s in self.staleness]


@dataclass(frozen=True, slots=True)
class Accounting:
    """Counts since the controller was made.

    Every record taken from the buffer ends as exactly one of ``consumed`` (returned to the
    trainer; ``kept_stale`` of them over the bound, under ``KEEP``), ``dropped``,
    ``routed_offline`` or ``from_future`` (stamped with a version newer than the
    trainer's); a redelivery of a record already taken is counted in ``duplicates`` and
    nowhere else. So, with the buffer's ``pending`` (records published
    and not committed, ``Producer.pending()``)::

        published = consumed + dropped + routed_offline + from_future + undecided
                    + (pending - held)

    ``pending - held`` is what is still buffered, never taken by this controller. The
    balance is exact while this controller is its group's only consumer, except between
    :meth:`SyncController.reopen` and the arrival of the old consumer's redeliveries. A
    step a producer published twice is two records: its second copy is a duplicate and
    belongs on the right-hand side too (:meth:`balance` takes them as ``extra``)."""

    consumed: int = 0
    duplicates: int = 0
    dropped: int = 0
    routed_offline: int = 0
    kept_stale: int = 0
    from_future: int = 0  # stamped with a version newer than the trainer's: dropped
    committed: int = 0  # deliveries committed (duplicates included)
    held: int = 0  # deliveries taken from the current consumer and not committed yet
    undecided: int = 0  # new records taken and not yet returned or handled (after an error)

    def balance(self, published: int, pending: int, extra: int = 0) -> int:
        """``published`` minus everything accounted for: 0 when the books balance."""
        buffered = pending - self.held
        settled = (
            self.consumed + self.dropped + self.routed_offline + self.from_future + self.undecided
        )
        return published - settled - buffered - extra


class LoopMetrics:
    """The trainer side's Prometheus metrics, in ``registry`` (its own by default).

    ``rl_policy_version`` (gauge, the trainer's version), ``rl_experience_staleness``
    (histogram, versions, of every new record when the controller decides on it),
    ``rl_experience_{consumed,dropped,routed,duplicates,kept_stale,undecodable,from_future}_total``
    (counters),
    ``rl_buffer_latency_seconds`` (histogram: from the server's answer, ``served_at``, to
    the controller taking the record), ``rl_buffer_pending`` (gauge, set by
    :meth:`SyncController.lag`) and ``rl_trainer_busy_ratio`` (gauge the trainer sets)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.policy_version = Gauge(
            "rl_policy_version", "The trainer's last published policy version", registry=r
        )
        self.staleness = Histogram(
            "rl_experience_staleness",
            "Versions between the trainer and each new record, when the controller decides on it",
            buckets=STALENESS_BUCKETS, registry=r,
        )  # fmt: skip
        self.consumed = _counter("consumed", "New records returned to the trainer", r)
        self.dropped = _counter("dropped", "Over-stale records dropped (fallback drop)", r)
        self.routed = _counter("routed", "Over-stale records routed to the offline buffer", r)
        self.duplicates = _counter("duplicates", "Redeliveries dropped by deduplication", r)
        self.kept_stale = _counter("kept_stale", "Over-stale records returned, marked (keep)", r)
        self.undecodable = _counter(
            "undecodable", "Poison records the buffer skipped (not an experience record)", r
        )
        self.from_future = _counter(
            "from_future", "Records stamped with a version newer than the trainer's: dropped", r
        )
        self.latency = Histogram(
            "rl_buffer_latency_seconds",
            "From the server's answer (served_at) to the trainer taking the record",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.pending = Gauge(
            "rl_buffer_pending", "Records published and not yet committed (buffer lag)", registry=r
        )
        self.busy_ratio = Gauge(
            "rl_trainer_busy_ratio", "Share of wall time the trainer spends learning", registry=r
        )

    def busy(self, fraction: float) -> None:
        """Set the trainer's busy ratio (0..1): time spent learning over wall time, for
        instance over the last update (on CPU this stands in for accelerator busy)."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"busy ratio must be within 0..1, got {fraction}")
        self.busy_ratio.set(fraction)

    def serve_metrics(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` for this registry on ``addr:port`` from a daemon thread;
        returns the port (``port=0`` picks a free one)."""
        server, _ = start_http_server(port, addr, registry=self.registry)
        return int(server.server_port)


def _counter(what: str, doc: str, registry: CollectorRegistry) -> Counter:
    return Counter(f"rl_experience_{what}", doc, registry=registry)


@dataclass(eq=False, slots=True)
class _Entry:
    """A delivery the controller took from the current consumer and has not committed."""

    delivery: Delivery
    done: bool = False  # may be committed (once every earlier entry may be too)
    waiting: list[_Entry] = field(default_factory=list)  # redeliveries done when this is


class SyncController(Generic[R]):
    """Reads batches from ``consumer`` for a trainer, bounding their staleness.

    ``max_staleness=None`` disables the bound (staleness is still measured and reported).
    ``fallback`` is a :class:`Fallback` or its name (``fallback_strategy`` as configured).
    ``fallback=Fallback.OFFLINE`` needs ``offline``, a producer for the offline buffer
    (e.g. the stream ``rl_experience_offline``). ``version`` is the trainer's version to
    start from (:meth:`set_version` moves it). ``dedupe`` may be shared with an earlier
    controller of the same trainer so that it recognises its redeliveries."""

    def __init__(
        self,
        consumer: Consumer,
        *,
        max_staleness: int | None,
        fallback: Fallback | str,
        offline: Producer | None = None,
        metrics: LoopMetrics | None = None,
        version: int = 0,
        pending: Callable[[], int] | None = None,
        dedupe: Deduplicator | None = None,
        records: type[R] | None = None,
    ) -> None:
        fallback = _check_policy(max_staleness, fallback, offline)
        self._records = cast("type[Step | Completion]", records or Step)
        self.max_staleness = max_staleness
        self.fallback = fallback
        self._consumer = consumer
        self._undecodable_seen = consumer.counts.undecodable
        self._offline = offline
        self._metrics = metrics
        self._pending = pending  # the buffer's pending(): for lag()
        self._dedupe = dedupe or Deduplicator()
        self._version = version
        self._version_lock = threading.Lock()
        self._queue: deque[_Entry] = deque()  # taken from the consumer, in poll order
        self._carry: deque[_Entry] = deque()  # new, neither returned nor handled yet
        self._live: dict[str, _Entry] = {}  # new records not done yet, by key
        self._held: dict[int, list[_Entry]] = {}  # returned batches, by id
        self._ids = itertools.count()
        self._unflushed = False  # routed records the offline producer may not have stored
        self._counts = dict.fromkeys(
            (
                "consumed",
                "duplicates",
                "dropped",
                "routed_offline",
                "kept_stale",
                "from_future",
                "committed",
            ),
            0,
        )
        if metrics is not None:
            metrics.policy_version.set(version)

    # -- the trainer's version -------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """The version the trainer last published (it never moves back: ValueError)."""
        with self._version_lock:
            if version < self._version:
                raise ValueError(
                    f"trainer version {version} is older than {self._version}: versions only "
                    "move forward (a restarted trainer makes a new controller)"
                )
            self._version = version
        if self._metrics is not None:
            self._metrics.policy_version.set(version)

    # -- batches ---------------------------------------------------------------------

    def next_batch(self, size: int, timeout_s: float) -> Batch[R]:
        """Up to ``size`` new records within the bound. Polls until the batch is full or
        a poll brings nothing: ``timeout_s`` bounds the waiting for records to arrive, not
        the reading of records already buffered, so over-stale records ahead of fresh ones
        never make a batch short (the reading ends: the controller commits nothing while it
        reads, so producers stop at the buffer's ``max_pending``). Over-stale records met
        on the way are handled per the fallback; redeliveries are dropped. The batch may
        be short, or empty."""
        if size < 1:
            raise ValueError(f"batch size must be at least 1, got {size}")
        self._flush()  # what earlier calls handled (a failure here leaves all in place)
        deadline = time.monotonic() + timeout_s
        chosen: list[_Entry] = []
        taken: list[_Entry] = []
        try:
            while len(chosen) < size:
                taken, more = self._take(size - len(chosen), deadline)
                chosen.extend(self._admit(taken))
                taken = []
                if not more:
                    break
            batch = self._finish(chosen)
        except BaseException:
            self._carry.extendleft(reversed(chosen + taken))  # decided first next time
            raise
        if not batch.steps:
            self._flush()  # else the trainer's commit does, after using the batch
        return batch

    def commit(self, batch: Batch[R]) -> None:
        """Commit ``batch`` once the trainer has used it (its redeliveries, if the
        consumer was reopened meanwhile, are committed with it). Committing a batch
        twice is harmless."""
        entries = self._held.pop(batch.id, None)
        if entries is None:
            return
        for entry in entries:
            self._complete(entry)
        self._flush()

    def reopen(self, consumer: Consumer) -> None:
        """Continue with ``consumer``, a new consumer of the same group (the old one
        failed, or was closed). What the old one held uncommitted is delivered again:
        records already returned or handled come back as duplicates and are committed
        once the original is done (a held batch: when the trainer commits it); records
        taken and not yet decided on are decided from the copy already taken."""
        self._consumer = consumer
        self._undecodable_seen = consumer.counts.undecodable
        self._queue = deque()

    def lag(self) -> int | None:
        """The buffer's pending records (published, not committed), if the controller
        was given ``pending``; also sets ``rl_buffer_pending``."""
        if self._pending is None:
            return None
        pending = self._pending()
        if self._metrics is not None:
            self._metrics.pending.set(pending)
        return pending

    def accounting(self) -> Accounting:
        return Accounting(
            **self._counts,
            held=len(self._queue),
            undecided=len(self._carry),
        )

    # -- taking records --------------------------------------------------------------

    def _take(self, want: int, deadline: float) -> tuple[list[_Entry], bool]:
        """New records, undecided ones first, else from one poll (its duplicates are
        handled here); and whether anything came (False: the poll timed out)."""
        if self._carry:
            return [self._carry.popleft() for _ in range(min(want, len(self._carry)))], True
        deliveries = self._consumer.poll(want, max(0.0, deadline - time.monotonic()))
        self._count_undecodable()
        now = time.time()
        new = []
        for delivery in deliveries:
            self._check_kind(delivery.step)
            entry = _Entry(delivery)
            self._queue.append(entry)
            if self._dedupe.fresh(delivery.step):
                self._live[delivery.step.key] = entry
                new.append(entry)
                if self._metrics is not None:
                    self._metrics.latency.observe(max(0.0, now - delivery.step.served_at))
            else:
                self._duplicate(entry)
        return new, bool(deliveries)

    def _count_undecodable(self) -> None:
        """Poison records the consumer skipped since the last poll, into the metric."""
        skipped = self._consumer.counts.undecodable
        if self._metrics is not None and skipped > self._undecodable_seen:
            self._metrics.undecodable.inc(skipped - self._undecodable_seen)
        self._undecodable_seen = skipped

    def _check_kind(self, record: Record) -> None:
        if not isinstance(record, self._records):
            raise ConfigError(
                f"the buffer delivered a {type(record).__name__} record ({record.key}), but "
                f"this trainer learns from {self._records.__name__} records: give each kind "
                "of worker a buffer (or stream, topic) of its own"
            )

    def _duplicate(self, entry: _Entry) -> None:
        """A redelivery: committed with its original (at once if that is done)."""
        self._counts["duplicates"] += 1
        if self._metrics is not None:
            self._metrics.duplicates.inc()
        original = self._live.get(entry.delivery.step.key)
        if original is None:
            entry.done = True
        else:
            original.waiting.append(entry)

    # -- deciding ----------------------------------------------------------------------

    def _admit(self, entries: list[_Entry]) -> list[_Entry]:
        """The entries to return; over-stale ones are handled per the fallback, and ones
        from the future dropped."""
        version = self._version
        if any(e.delivery.step.model_version > version for e in entries):
            ahead = [e for e in entries if e.delivery.step.model_version > version]
            self._from_future(ahead, version)
            entries = [e for e in entries if e.delivery.step.model_version <= version]
        if self.max_staleness is None or self.fallback == Fallback.KEEP:
            return entries
        k = self.max_staleness
        keep = [e for e in entries if version - e.delivery.step.model_version <= k]
        if len(keep) < len(entries):
            stale = [e for e in entries if version - e.delivery.step.model_version > k]
            self._handle(stale, version)
        return keep

    def _finish(self, chosen: list[_Entry]) -> Batch[R]:
        """The batch, checked against the version now (handling what went stale)."""
        version = self._version
        if self.max_staleness is not None and self.fallback != Fallback.KEEP:
            k = self.max_staleness
            stale = [e for e in chosen if version - e.delivery.step.model_version > k]
            if stale:
                self._handle(stale, version)
                chosen = [e for e in chosen if not e.done]
        return self._batch(chosen, version)

    def _batch(self, chosen: list[_Entry], version: int) -> Batch[R]:
        steps = cast(list[R], [e.delivery.step for e in chosen])  # their kind: checked taken
        staleness = [version - s.model_version for s in steps]
        batch = Batch(
            steps=steps,
            staleness=staleness,
            version=version,
            max_staleness=self.max_staleness,
            deliveries=[e.delivery for e in chosen],
            id=next(self._ids),
        )
        if chosen:
            self._held[batch.id] = chosen
        kept_stale = sum(batch.stale())
        self._counts["consumed"] += len(steps)
        self._counts["kept_stale"] += kept_stale
        if self._metrics is not None:
            self._metrics.consumed.inc(len(steps))
            self._metrics.kept_stale.inc(kept_stale)
            for s in staleness:
                self._metrics.staleness.observe(s)
        return batch

    def _from_future(self, entries: list[_Entry], version: int) -> None:
        """Records stamped with a version the trainer has not published: logged (once per
        poll), counted and dropped."""
        first = entries[0].delivery.step
        log.error(
            "record %s is stamped with version %d, newer than the trainer's %d (and %d more "
            "such records in this poll): dropped; is another trainer pushing to the server, "
            "or did this trainer start from an older checkpoint than the server serves?",
            first.key,
            first.model_version,
            version,
            len(entries) - 1,
        )
        self._counts["from_future"] += len(entries)
        if self._metrics is not None:
            self._metrics.from_future.inc(len(entries))
        for entry in entries:
            self._complete(entry)

    def _handle(self, stale: list[_Entry], version: int) -> None:
        """Drop or route over-stale records (all of them or, on an error, none)."""
        if self.fallback == Fallback.OFFLINE:
            assert self._offline is not None
            self._offline.publish([e.delivery.step for e in stale])
            self._unflushed = True
            self._counts["routed_offline"] += len(stale)
        else:
            self._counts["dropped"] += len(stale)
        if self._metrics is not None:
            m = self._metrics
            (m.routed if self.fallback == Fallback.OFFLINE else m.dropped).inc(len(stale))
            for e in stale:
                m.staleness.observe(version - e.delivery.step.model_version)
        for entry in stale:
            self._complete(entry)

    # -- committing --------------------------------------------------------------------

    def _complete(self, entry: _Entry) -> None:
        """``entry`` is done: it, and the redeliveries waiting for it, may be committed."""
        entry.done = True
        key = entry.delivery.step.key
        if self._live.get(key) is entry:
            del self._live[key]
        for waiting in entry.waiting:
            waiting.done = True
        entry.waiting.clear()

    def _flush(self) -> None:
        """Commit the done entries at the front of the queue, in poll order; routed
        records reach the offline buffer's storage first."""
        done: list[_Entry] = []
        while self._queue and self._queue[0].done:
            done.append(self._queue.popleft())
        if not done:
            return
        try:
            if self._unflushed:
                assert self._offline is not None
                self._offline.flush()
                self._unflushed = False
            self._consumer.commit([e.delivery for e in done])
        except BaseException:
            self._queue.extendleft(reversed(done))
            raise
        self._counts["committed"] += len(done)


def _check_policy(
    max_staleness: int | None, fallback: Fallback | str, offline: Producer | None
) -> Fallback:
    if max_staleness is not None and max_staleness < 0:
        raise ConfigError(f"max_staleness must be >= 0 or unset, got {max_staleness}")
    try:
        fallback = Fallback(fallback)
    except ValueError:
        raise ConfigError(
            f"fallback_strategy {fallback!r}: use one of {', '.join(map(str, Fallback))}"
        ) from None
    if fallback == Fallback.OFFLINE and max_staleness is not None and offline is None:
        raise ConfigError(
            "fallback_strategy 'offline' needs an offline buffer to route over-stale records "
            "to (e.g. the stream rl_experience_offline)"
        )
    return fallback
