"""Redis Streams experience buffer: ``redis://host:6379/0?stream=rl_experience``.

One stream holds every step in one total order, so an episode's order holds. Each step is
one stream entry whose only field names its encoding: ``s`` for
:func:`loop.experience.encode`'s bytes, ``z`` for the same bytes compressed with zstd
(``BufferOptions.compression = "zstd"``). A consumer group (``XGROUP CREATE … 0 MKSTREAM``)
gives every group every entry; within a group each entry goes to one consumer.

Query parameters of the URL (the rest go to the Redis client, e.g. ``socket_timeout``):

- ``stream``: the stream's key, default ``rl_experience``.
- ``claim_idle_s``: when set, a consumer's ``poll`` also claims entries that another
  consumer of its group was given and has not committed for this long
  (:meth:`RedisConsumer.claim_abandoned`): for a consumer that died and is never restarted
  under its name. Choose it well above the longest time a batch takes to process: a slow
  consumer's entries would be claimed too, and delivered twice.
- ``trim_every`` (records, default 1000) and ``trim_interval_s`` (default 1.0): how often a
  consumer trims after commits (see below).

Guarantees (``loop.buffers.base``):

- **Publishing**: a publish is one ``MULTI``/``EXEC`` round trip of ``XADD``s, so its steps
  are stored together and in order; ``publish`` returns once Redis has answered.
  Connection errors (a Redis restart) are retried until ``publish_timeout_s``, then
  :class:`~loop.buffers.base.BufferUnavailable`. A retry after an answer was lost may store
  steps twice: at least once, deduplicated by the consumer.
- **Durability**: an acknowledged publish survives a Redis restart only with persistence:
  ``appendonly yes`` with ``appendfsync everysec`` (survives the process being killed; a
  machine crash loses up to the last second) or ``appendfsync always`` (survives both, at
  an fsync per write: here 64-step publishes took about 2.5 ms instead of 1 ms at the
  median). Without it a restart loses the stream and the group; the consumer then
  recreates an empty group and logs a warning. Needs Redis 6.2 or newer (``XAUTOCLAIM``,
  ``XTRIM MINID``).
- **Poison entries**: an entry that is not an experience record (other fields, bytes that
  do not decode, a zstd field that decompresses beyond ``max_record_bytes``) is logged,
  counted (``undecodable``), copied to the stream ``<stream>-dead`` with its id as
  ``origin`` (the newest ~10,000 kept) and acknowledged, in one transaction; the entries
  around it are delivered.
- **Delivery**: a consumer reads its own pending entries first (``XREADGROUP … 0``: what it
  was given and did not commit before a restart or a connection error), then new ones
  (``>``). ``commit`` is ``XACK``. ``close`` keeps the uncommitted entries in the consumer's
  pending list: the same name gets them again when it starts; another consumer gets them
  through ``claim_idle_s``. Claimed entries are older than what the claimer may already have
  processed, so order within an episode holds per consumer, not across a claim.
- **Trimming and back-pressure**: entries every group has acknowledged are removed with
  ``XTRIM MINID`` to the oldest entry still needed: per group, the oldest pending entry or
  the first not yet delivered. Consumers trim after commits (every ``trim_every`` records
  or ``trim_interval_s``), and a producer trims before it measures. ``pending()`` is the
  stream's length after trimming: every record from the oldest one some group still needs
  to the newest (an upper bound on unacknowledged records when a group acknowledges out of
  order; every record while no group exists yet). A producer checks it only when its last
  known length nears ``max_pending`` (each producer checks at its own last publish, so
  several producers can overshoot by a batch each). A group created after trimming sees
  only the entries still in the stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kernel.errors import ConfigError
from loop.buffers.base import (
    BufferFull,
    BufferOptions,
    BufferUnavailable,
    ConsumerCounts,
    Delivery,
    Overflow,
    ProducerCounts,
    RecordReader,
)
from loop.experience import Record, encode

log = logging.getLogger("rlserve.buffers.redis")

DEFAULT_STREAM = "rl_experience"
FIELD_PLAIN = b"s"  # the entry's value is loop.experience.encode's bytes
FIELD_ZSTD = b"z"  # the same bytes, zstd-compressed
ORIGIN_FIELD = b"origin"  # a dead-lettered entry's id in the stream it came from
DEAD_MAXLEN = 10_000  # entries <stream>-dead keeps, about (the oldest are trimmed)
SOCKET_TIMEOUT_S = 10.0  # a reply slower than this is a connection error
BLOCK_SLICE_S = 2.0  # a blocking read waits at most this long per command (< socket timeout)
CLAIM_CHECK_S = 1.0  # poll looks for abandoned entries at most this often
_OUR_PARAMETERS = ("stream", "claim_idle_s", "trim_every", "trim_interval_s")
_TRANSIENT_REPLIES = ("OOM", "MISCONF", "READONLY", "LOADING", "TRYAGAIN", "MASTERDOWN")

T = TypeVar("T")
_Entry = tuple[bytes, Mapping[bytes, bytes] | None]  # an id and its fields (none: deleted)


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A ``redis://`` buffer URL, split into the stream's settings and the client's URL."""

    url: str  # as configured: for messages
    client_url: str  # without this module's parameters
    stream: str = DEFAULT_STREAM
    claim_idle_s: float | None = None
    trim_every: int = 1000
    trim_interval_s: float = 1.0


def parse_url(url: str) -> RedisTarget:
    """Split ``url``; :class:`ConfigError` naming the parameter when one is malformed."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    ours = {k: v for k, v in query if k in _OUR_PARAMETERS}
    rest = [(k, v) for k, v in query if k not in _OUR_PARAMETERS]
    client_url = urlunsplit(parts._replace(query=urlencode(rest)))
    try:
        claim = float(ours["claim_idle_s"]) if "claim_idle_s" in ours else None
        target = RedisTarget(
            url=url,
            client_url=client_url,
            stream=ours.get("stream") or DEFAULT_STREAM,
            claim_idle_s=claim,
            trim_every=int(ours.get("trim_every", 1000)),
            trim_interval_s=float(ours.get("trim_interval_s", 1.0)),
        )
    except ValueError as error:
        raise ConfigError(
            f"data_buffer {url!r}: {error}; claim_idle_s and trim_interval_s are seconds, "
            "trim_every a number of records"
        ) from error
    if target.trim_every < 1 or (claim is not None and claim <= 0):
        raise ConfigError(
            f"data_buffer {url!r}: trim_every must be at least 1 and claim_idle_s positive"
        )
    return target


def stream_id(entry_id: bytes | str) -> tuple[int, int]:
    """A stream id (``"<ms>-<seq>"``) as a tuple that orders like Redis orders ids."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _next_id(entry_id: bytes | str) -> tuple[int, int]:
    ms, seq = stream_id(entry_id)
    return (ms + 1, 0) if seq >= 2**64 - 1 else (ms, seq + 1)


class _Stream:
    """One client on one stream: retries, error messages and trimming, shared by the
    producer and the consumer."""

    def __init__(self, url: str, options: BufferOptions) -> None:
        if options.compression not in (None, "zstd"):
            raise ConfigError(
                f"data_buffer {url!r}: compression {options.compression!r} is not supported; "
                "use zstd or none"
            )
        self.target = parse_url(url)
        self.options = options
        self.key = self.target.stream
        connect_s = max(0.1, min(2.0, options.publish_timeout_s))
        self.client: redis.Redis = redis.Redis.from_url(
            self.target.client_url,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=connect_s,
            retry=Retry(NoBackoff(), 0),  # retried here, within the caller's deadline
        )
        timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        self.block_slice_s = min(BLOCK_SLICE_S, float(timeout) / 2) if timeout else BLOCK_SLICE_S

    def call(
        self,
        action: Callable[[], T],
        doing: str,
        timeout_s: float | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """``action()``, retrying connection errors and transient refusals (loading,
        out of memory, read-only replica) for ``timeout_s`` (default ``publish_timeout_s``),
        then :class:`BufferUnavailable`. ``on_retry`` runs before each retry."""
        budget_s = self.options.publish_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget_s
        delay = 0.02
        while True:
            try:
                return action()
            except redis.AuthenticationError as error:
                raise BufferUnavailable(
                    f"Redis at {self.target.url} refused the credentials while {doing}: "
                    f"{error}. Put the right user and password in the URL "
                    "(redis://user:password@host:port/db)."
                ) from error
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as error:
                if isinstance(error, redis.ResponseError) and not _transient(error):
                    raise self._refused(error) from error
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BufferUnavailable(self._unavailable(doing, budget_s, error)) from error
                log.debug("redis %s: %s; retrying", doing, error)
            time.sleep(min(delay, remaining))  # the last try comes at the deadline
            delay = min(delay * 2, 0.5)
            if on_retry is not None:
                on_retry()

    def _unavailable(self, doing: str, budget_s: float, error: Exception) -> str:
        return (
            f"Redis buffer {self.target.url} is unavailable while {doing} "
            f"(retried for {budget_s:g} s): {error}. Start redis-server there (appendonly "
            "yes keeps acknowledged steps across restarts), or point data_buffer at the "
            "right host and port."
        )

    def _refused(self, error: redis.ResponseError) -> Exception:
        if str(error).startswith("WRONGTYPE"):
            return ConfigError(
                f"data_buffer {self.target.url!r}: the key {self.key!r} holds something other "
                "than a stream; choose another name with ?stream=NAME"
            )
        return error

    def trim(self) -> int:
        """Remove the entries every consumer group has acknowledged; how many went."""
        try:
            groups = self.client.xinfo_groups(self.key)
        except redis.ResponseError as error:
            if "no such key" in str(error).lower():
                return 0
            raise
        if not groups:
            return 0  # nobody has acknowledged anything: a group created later reads all
        pipe = self.client.pipeline(transaction=False)
        for group in groups:
            pipe.xpending(self.key, group["name"])
        floor = min(
            _oldest_needed(group, pending)
            for group, pending in zip(groups, pipe.execute(), strict=True)
        )
        removed = self.client.xtrim(self.key, minid=f"{floor[0]}-{floor[1]}", approximate=False)
        return int(removed)

    def pending(self, timeout_s: float | None = None, doing: str = "measuring the stream") -> int:
        """The stream's length after trimming (see the module's docstring)."""

        def measure() -> int:
            self.trim()
            return int(self.client.xlen(self.key))

        return self.call(measure, doing, timeout_s)

    def close(self) -> None:
        self.client.close()


def _oldest_needed(group: Mapping[str, Any], pending: Mapping[str, Any]) -> tuple[int, int]:
    """The oldest id ``group`` still needs: its oldest pending entry, or else the first
    one after the last it was given."""
    needed = _next_id(group["last-delivered-id"])
    if pending.get("pending") and pending.get("min") is not None:
        needed = min(needed, stream_id(pending["min"]))
    return needed


def _transient(error: redis.ResponseError) -> bool:
    return str(error).startswith(_TRANSIENT_REPLIES)


def _compressor() -> Callable[[bytes], bytes]:
    import zstandard

    compress: Callable[[bytes], bytes] = zstandard.ZstdCompressor(level=3).compress
    return compress


class RedisProducer:
    """Appends steps to the stream; back-pressure on the trimmed length (module docstring)."""

    def __init__(self, url: str, options: BufferOptions) -> None:
        self._stream = _Stream(url, options)
        self.options = options
        self.counts = ProducerCounts()
        self._compress = _compressor() if options.compression == "zstd" else None
        self._length: int | None = None  # the stream's length at our last publish or check

    def publish(self, steps: Sequence[Record]) -> None:
        """Store ``steps`` in order in one round trip. Waits for room up to
        ``publish_timeout_s``, then raises :class:`BufferFull` or drops and counts them
        (``overflow``); retries connection errors within the same deadline."""
        if not steps:
            return
        deadline = time.monotonic() + self.options.publish_timeout_s
        if not self._wait_for_room(len(steps), deadline):
            self._overflow(steps)
            return
        entries = [self._fields(step) for step in steps]
        remaining = max(0.0, deadline - time.monotonic())
        self._length = self._stream.call(lambda: self._add(entries), "publishing", remaining)
        self.counts.published += len(steps)

    def pending(self) -> int:
        """Records not yet acknowledged by the slowest consumer group: the stream's length
        after trimming (an upper bound; every record while no group exists)."""
        return self._stream.pending()

    def flush(self, timeout_s: float = 10.0) -> None:
        """Nothing to do: ``publish`` returns only once Redis has stored the steps (in its
        append-only file as ``appendfsync`` says)."""

    def close(self) -> None:
        self._stream.close()

    def _fields(self, step: Record) -> dict[bytes, bytes]:
        data = encode(step)
        if self._compress is None:
            return {FIELD_PLAIN: data}
        return {FIELD_ZSTD: self._compress(data)}

    def _add(self, entries: list[dict[bytes, bytes]]) -> int:
        pipe = self._stream.client.pipeline(transaction=True)
        for fields in entries:
            pipe.xadd(self._stream.key, fields)
        pipe.xlen(self._stream.key)
        return int(pipe.execute()[-1])

    def _wait_for_room(self, count: int, deadline: float) -> bool:
        """Whether ``count`` more records fit before ``deadline``: at once when the length
        this producer saw last leaves room, else measured (trimming) until there is room. A
        batch larger than ``max_pending`` fits into an empty stream."""
        limit = self.options.max_pending
        if self._length is not None and self._length + count <= limit:
            return True
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            self._length = self._stream.pending(remaining, "publishing (measuring the stream)")
            if self._length + count <= limit or self._length == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def _overflow(self, steps: Sequence[Record]) -> None:
        stream, options = self._stream.key, self.options
        if options.overflow is Overflow.DROP:
            self.counts.dropped += len(steps)
            log.warning(
                "redis stream %s full (%d records pending, max_pending %d) for %g s: "
                "dropped %d steps (%d in all)",
                stream,
                self._length,
                options.max_pending,
                options.publish_timeout_s,
                len(steps),
                self.counts.dropped,
            )
            return
        raise BufferFull(
            f"Redis stream {stream!r} at {self._stream.target.url} held {self._length} "
            f"unacknowledged records (max_pending {options.max_pending}) for "
            f"{options.publish_timeout_s:g} s: no consumer group keeps up. Start or speed up "
            "the trainer, raise max_pending, or set overflow: drop."
        )


class RedisConsumer:
    """A consumer named ``name`` in consumer group ``group`` (created from the stream's
    first entry if missing). See the module's docstring for what it guarantees."""

    def __init__(self, url: str, group: str, name: str, options: BufferOptions) -> None:
        self._stream = _Stream(url, options)
        self.group = group
        self.name = name
        self.counts = ConsumerCounts()
        self._reader = RecordReader(options, self.counts, log)
        self._own_cursor: bytes | str | None = "0"  # reading our pending list; None: new ones
        self._acked_since_trim = 0
        self._last_trim = time.monotonic()
        self._last_claim = float("-inf")
        self._claim_more = False  # the last claim filled its batch: more may wait
        self._stream.call(self._create_group, "creating the consumer group")

    # -- reading

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        """Up to ``max_records`` deliveries in stream order, waiting up to ``timeout_s``
        for the first: this consumer's own uncommitted entries first, then (with
        ``claim_idle_s``) abandoned ones of its group, then new ones."""
        if max_records <= 0:
            return []
        deadline = time.monotonic() + max(0.0, timeout_s)
        out: list[Delivery] = []
        while len(out) < max_records:
            reading_own = self._own_cursor is not None
            if not reading_own and self._claim_due():
                out.extend(self.claim_abandoned(self._claim_idle_s(), max_records - len(out)))
                continue
            block_ms = None if out or reading_own else self._block_ms(deadline)
            out.extend(self._read(max_records - len(out), block_ms))
            if reading_own:
                continue  # until our pending list is read, then on to new entries
            if out or block_ms is None:
                break
        out.sort(key=lambda d: stream_id(d.position))
        return out

    def claim_abandoned(self, min_idle_s: float, max_records: int = 100) -> list[Delivery]:
        """Take over up to ``max_records`` entries that consumers of this group were given
        and have not committed for ``min_idle_s`` (``XAUTOCLAIM``): a dead consumer's
        batch, delivered again here. Entries deleted from the stream meanwhile are
        dropped from the pending list and logged."""
        self._last_claim = time.monotonic()
        idle_ms = max(0, int(min_idle_s * 1000))
        cursor: bytes | str = "0-0"
        out: list[Delivery] = []
        while len(out) < max_records:
            reply = self._stream.call(
                partial(self._xautoclaim, idle_ms, cursor, max_records - len(out)),
                "claiming abandoned entries",
            )
            cursor, entries = reply[0], reply[1]
            if len(reply) > 2 and reply[2]:
                log.warning(
                    "redis stream %s: %d entries pending in group %s were deleted before "
                    "anyone committed them: %s",
                    self._stream.key,
                    len(reply[2]),
                    self.group,
                    reply[2],
                )
            out.extend(self._deliver(entries))
            if cursor in (b"0-0", "0-0"):
                break
        self._claim_more = len(out) >= max_records
        return out

    # -- committing

    def commit(self, deliveries: Sequence[Delivery]) -> None:
        """``XACK`` every delivery (one round trip); they are never delivered to this group
        again. Trims the stream every ``trim_every`` records or ``trim_interval_s``."""
        if not deliveries:
            return
        ids = [d.position for d in deliveries]
        retried = False

        def again() -> None:
            nonlocal retried
            retried = True

        acked = self._stream.call(lambda: self._ack(ids), "committing", on_retry=again)
        for delivery, count in zip(deliveries, acked, strict=True):
            # After a lost answer the first attempt may have acknowledged it already.
            if count or retried:
                self.counts.committed += 1
                version = delivery.step.model_version
                self.counts.by_version[version] = self.counts.by_version.get(version, 0) + 1
        self._acked_since_trim += len(deliveries)
        self._maybe_trim()

    def close(self) -> None:
        """Disconnect. Uncommitted entries stay pending under this consumer's name: it gets
        them again when it starts; another consumer claims them (``claim_idle_s``)."""
        self._stream.close()

    # -- internals

    def _create_group(self) -> None:
        try:
            self._stream.client.xgroup_create(self._stream.key, self.group, id="0", mkstream=True)
        except redis.ResponseError as error:
            if not str(error).startswith("BUSYGROUP"):
                raise

    def _read(self, count: int, block_ms: int | None) -> list[Delivery]:
        """One ``XREADGROUP``: our pending list from the cursor, or new entries. A
        connection error sends us back to the start of our pending list: a lost answer's
        entries were given to us."""
        cursor, reply = self._stream.call(
            lambda: self._xreadgroup(count, block_ms), "reading", on_retry=self._reread_own
        )
        entries = reply[0][1] if reply else []
        if cursor != ">":
            if len(entries) < count:
                self._own_cursor = None
            elif entries:
                self._own_cursor = entries[-1][0]
        return self._deliver(entries)

    def _xreadgroup(self, count: int, block_ms: int | None) -> tuple[bytes | str, Any]:
        cursor = self._own_cursor if self._own_cursor is not None else ">"
        streams: dict[Any, Any] = {self._stream.key: cursor}
        try:
            reply = self._stream.client.xreadgroup(
                self.group, self.name, streams, count=count, block=block_ms
            )
        except redis.ResponseError as error:
            if not str(error).startswith("NOGROUP"):
                raise
            log.warning(
                "redis stream %s: consumer group %s is gone (Redis restarted without "
                "persistence, or the key was deleted); recreating it",
                self._stream.key,
                self.group,
            )
            self._create_group()
            reply = self._stream.client.xreadgroup(self.group, self.name, streams, count=count)
        return cursor, reply

    def _xautoclaim(self, idle_ms: int, cursor: bytes | str, count: int) -> Any:
        return self._stream.client.xautoclaim(
            self._stream.key, self.group, self.name, idle_ms, start_id=cursor, count=count
        )

    def _reread_own(self) -> None:
        self._own_cursor = "0"

    def _deliver(
        self, entries: Sequence[tuple[bytes, Mapping[bytes, bytes] | None]]
    ) -> list[Delivery]:
        out: list[Delivery] = []
        gone: list[bytes] = []
        poison: list[tuple[bytes, Mapping[bytes, bytes]]] = []
        for entry_id, fields in entries:
            if not fields:
                gone.append(entry_id)  # deleted from the stream while pending
                continue
            record = self._record(entry_id, fields)
            if record is None:
                poison.append((entry_id, fields))
                continue
            out.append(Delivery(record, entry_id.decode()))
        if gone:
            log.warning(
                "redis stream %s: %d entries pending for %s were deleted from the stream "
                "before being committed; acknowledging them: %s",
                self._stream.key,
                len(gone),
                self.name,
                gone,
            )
            self._stream.call(lambda: self._ack(gone), "acknowledging deleted entries")
        if poison:
            self._stream.call(lambda: self._dead_letter(poison), "dead-lettering entries")
        self.counts.delivered += len(out)
        return out

    def _record(self, entry_id: bytes, fields: Mapping[bytes, bytes]) -> Record | None:
        def where() -> str:
            return f"redis stream {self._stream.key!r} entry {entry_id.decode()}"

        if FIELD_PLAIN in fields:
            return self._reader.read(fields[FIELD_PLAIN], compressed=False, where=where)
        if FIELD_ZSTD in fields:
            return self._reader.read(fields[FIELD_ZSTD], compressed=True, where=where)
        self._reader.skipped(
            where(), f"fields {sorted(fields)}; expected {FIELD_PLAIN!r} or {FIELD_ZSTD!r}"
        )
        return None

    def _dead_letter(self, entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]]) -> None:
        """Copy entries no consumer can decode to ``<stream>-dead`` (with the id they had,
        as ``origin``) and acknowledge them, in one transaction: they are never delivered
        again, and nothing of them is lost for whoever looks."""
        dead = f"{self._stream.key}-dead"
        pipe = self._stream.client.pipeline(transaction=True)
        for entry_id, fields in entries:
            kept = {**fields, ORIGIN_FIELD: entry_id}
            pipe.xadd(dead, kept, maxlen=DEAD_MAXLEN, approximate=True)
            pipe.xack(self._stream.key, self.group, entry_id)
        pipe.execute()

    def _ack(self, ids: Sequence[Any]) -> list[int]:
        pipe = self._stream.client.pipeline(transaction=True)
        for entry_id in ids:
            pipe.xack(self._stream.key, self.group, entry_id)
        return [int(n) for n in pipe.execute()]

    def _maybe_trim(self) -> None:
        target = self._stream.target
        due = self._acked_since_trim >= target.trim_every or (
            time.monotonic() - self._last_trim >= target.trim_interval_s
        )
        if not due:
            return
        self._acked_since_trim = 0
        self._last_trim = time.monotonic()
        try:
            self._stream.trim()
        except redis.RedisError as error:  # the commit itself succeeded: trim next time
            log.warning("redis stream %s: trimming failed: %s", self._stream.key, error)

    def _claim_idle_s(self) -> float:
        return self._stream.target.claim_idle_s or 0.0

    def _claim_due(self) -> bool:
        idle = self._stream.target.claim_idle_s
        if idle is None:
            return False
        return self._claim_more or time.monotonic() - self._last_claim >= min(idle, CLAIM_CHECK_S)

    def _block_ms(self, deadline: float) -> int | None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        return max(1, int(min(remaining, self._stream.block_slice_s) * 1000))
