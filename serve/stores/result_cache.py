"""The result cache: repeated deterministic predict answers served from Redis (optional,
per model: ``result_cache: redis://host:port/db``).

The predict frontend (``serve.frontends.predict.http``) asks it around submission to the scheduler,
which never knows it exists:

1. once a request is validated, :func:`cache_key` names its answer, or says it has none
   (sampled or seeded actions always run the model). The key holds the model, the version
   and its sha256 (a new version is a new key space: a swap can never serve a stale answer),
   and a BLAKE2b digest of what decides the answer: the observations exactly as the model
   sees them (the graph's input arrays after decoding, validation and ``observation_bounds``
   clipping: their dtype, shape and bytes, so two JSON spellings of one observation share a
   key), actions given to score, the requested outputs, and whether the answer has a batch
   axis;
2. :meth:`ResultCache.lookup` asks Redis, which must answer within
   ``result_cache_timeout_ms``; a hit is the encoded answer itself, returned as the
   model's answer was;
3. on a miss the model runs and :meth:`ResultCache.store` queues the encoded answer to be
   written with the TTL (fire-and-forget: the request never waits for it). Only answers
   computed by the version the key names are stored, and never errors.

Redis is spoken to off the event loop. Each Redis URL (and timeout) has a :class:`_Link`:
two threads with a connection each, one sending the keys queued since its last round trip
as one ``MGET``, the other the answers queued as one pipeline of ``SET ... PX``. Under
load a round trip serves many requests; no request waits for a connection to open; and
the timeout is Redis's own time on the socket (a lookup's wait on a busy event loop is the
loop's queueing, which every request pays, not Redis being slow).

Redis down or slow never fails a request: a round trip that fails or outlasts its timeout
answers its lookups ``error`` (the model runs) and takes the link down; while it is down,
lookups are not asked (``unavailable``) and writes are dropped, and the thread connects
again at once (``QUICK_TRIES`` times, ``QUICK_RETRY_S`` apart: one slow answer is no
outage), then every ``RETRY_AFTER_S``. The client (redis-py, the ``cache`` extra) is
imported when a model with a cache first asks: a server without one never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from serve.config import ModelSettings
from serve.dataplane.messages import Prepared
from serve.metrics import Metrics
from serve.stores import redis_link

if TYPE_CHECKING:
    from redis import Redis

_FAILED = object()  # a lookup's result when its round trip failed

log = logging.getLogger("rlserve.result_cache")

KEY_PREFIX = b"rlserve:result:"
DIGEST_BYTES = 16  # BLAKE2b-128: 2^-64 odds of a collision among 2^32 cached answers
QUICK_TRIES, QUICK_RETRY_S = 5, 0.01  # a link that is down connects again at once, so often
RETRY_AFTER_S = 1.0  # and then this often
ROUND_TRIP_S = 1.0  # connecting, and a write pipeline, may take this long
WAIT_S = 2.0  # a lookup waits this long at most for its thread's answer (a backstop)
MAX_PENDING_WRITES = 1024  # answers waiting to be written, per link; more are dropped


class Lookup(StrEnum):
    """What a lookup found: the ``result`` label of ``rlserve_result_cache_lookups_total``."""

    HIT = "hit"
    MISS = "miss"
    ERROR = "error"  # Redis failed or did not answer within result_cache_timeout_ms
    UNAVAILABLE = "unavailable"  # not asked: the link is down (or not connected yet)


class Write(StrEnum):
    """What became of an answer to store: ``rlserve_result_cache_writes_total``'s label."""

    STORED = "stored"
    TOO_LARGE = "too_large"  # over result_cache_max_entry_bytes
    DROPPED = "dropped"  # not connected, or MAX_PENDING_WRITES already waiting
    ERROR = "error"  # the round trip that carried it failed


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """A model's result-cache settings (from its ModelSettings)."""

    url: str
    ttl_ms: int
    max_entry_bytes: int
    timeout_s: float

    @classmethod
    def of(cls, settings: ModelSettings) -> CacheSettings | None:
        """The model's cache, or None when it has none."""
        if settings.result_cache is None:
            return None
        return cls(
            settings.result_cache,
            max(1, round(settings.result_cache_ttl_s * 1000)),
            settings.result_cache_max_entry_bytes,
            settings.result_cache_timeout_ms / 1000,
        )


def cache_key(model: str, version: int, sha256: str, prepared: Prepared) -> bytes | None:
    """The Redis key of a validated request's answer on one version; None when the answer
    must come from the model every time (sampled or seeded actions, server-held memory)."""
    options = prepared.options
    if not options.deterministic or options.seed is not None:
        return None
    if prepared.sequence is not None:  # the answer depends on memory the server holds
        return None
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    digest.update(b"single\0" if prepared.single else b"batch\0")
    for kind in sorted(options.outputs):
        digest.update(kind.value.encode() + b"\0")
    for name in sorted(prepared.feeds):
        _digest_array(digest, b"feed:" + name.encode(), prepared.feeds[name])
    if prepared.evaluate is not None:
        _digest_array(digest, b"actions", prepared.evaluate)
    named = f"{model}:{version}:{sha256}:".encode()
    return KEY_PREFIX + named + digest.hexdigest().encode()


def _digest_array(digest: Any, name: bytes, array: np.ndarray) -> None:
    """An array's name, dtype (with byte order), shape and bytes: equal only when equal."""
    contiguous = np.ascontiguousarray(array)
    digest.update(b"%s\0%s\0%r\0" % (name, contiguous.dtype.str.encode(), contiguous.shape))
    digest.update(contiguous.data)


class ResultCache:
    """The result caches of one process's predict frontend: a :class:`_Link` per Redis URL
    and timeout (made when a model first asks, on the running event loop)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._links: dict[tuple[str, float], _Link] = {}

    async def lookup(self, model: str, settings: CacheSettings, key: bytes) -> bytes | None:
        """The cached answer, or None (the model must run): never raises."""
        result, found = await self._link(settings).lookup(key)
        self._metrics.result_cache_lookup(model, result.value)
        return found

    def store(self, model: str, settings: CacheSettings, key: bytes, answer: bytes) -> None:
        """Queue an answer to be written (the caller does not wait): never raises."""
        if len(answer) > settings.max_entry_bytes:
            self._metrics.result_cache_write(model, Write.TOO_LARGE.value)
            return
        if not self._link(settings).store(model, key, answer, settings.ttl_ms):
            self._metrics.result_cache_write(model, Write.DROPPED.value)

    def connected(self, url: str) -> bool:
        """Whether this process is connected to the cache at ``url`` (a link connects, in
        the background, when a model first asks: until then its requests run the model)."""
        return any(link.connected for (where, _), link in self._links.items() if where == url)

    async def close(self) -> None:
        """Write what is queued (within ROUND_TRIP_S), then close every link."""
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(asyncio.to_thread(link.close) for link in links))

    def _link(self, settings: CacheSettings) -> _Link:
        where = (settings.url, settings.timeout_s)
        link = self._links.get(where)
        if link is None:
            link = self._links[where] = _Link(*where, self._metrics)
        return link


class _Link:
    """One Redis as one process uses it: a thread and connection for lookups, a thread and
    connection for writes. The event loop only queues work and reads ``connected``; the
    threads answer through ``call_soon_threadsafe``."""

    def __init__(self, url: str, timeout_s: float, metrics: Metrics) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self.connected = False  # both connections answer (set by the threads)
        self._asked: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._to_write: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writes_waiting = 0  # queued, not yet sent (changed on the event loop only)
        self._closing = threading.Event()
        self._down = threading.Event()  # a round trip failed: connect again
        self._reads: Redis | None = None
        self._writes: Redis | None = None
        self._threads = {
            name: threading.Thread(target=run, name=f"rlserve-cache-{name}", daemon=True)
            for name, run in [
                ("link", self._run),
                ("lookups", self._send_lookups),
                ("writes", self._send_writes),
            ]
        }
        for thread in self._threads.values():
            thread.start()

    # ------------------------------------------------------------ on the event loop

    async def lookup(self, key: bytes) -> tuple[Lookup, bytes | None]:
        if not self.connected:
            return Lookup.UNAVAILABLE, None
        future: asyncio.Future[object] = self._loop.create_future()
        self._asked.put((key, future))
        try:
            async with asyncio.timeout(WAIT_S):
                found = await future
        except TimeoutError:
            return Lookup.ERROR, None
        if found is _FAILED:
            return Lookup.ERROR, None
        if not isinstance(found, bytes):  # None: not there (or expired)
            return Lookup.MISS, None
        return Lookup.HIT, found

    def store(self, model: str, key: bytes, answer: bytes, ttl_ms: int) -> bool:
        """Queue a write; False (dropped) while down or when too many wait."""
        if not self.connected or self._writes_waiting >= MAX_PENDING_WRITES:
            return False
        self._writes_waiting += 1
        self._to_write.put((model, key, answer, ttl_ms))
        return True

    def _written(self, models: list[str], result: Write) -> None:
        self._writes_waiting -= len(models)
        for model in models:
            self._metrics.result_cache_write(model, result.value)

    # ------------------------------------------------------------ on the link's threads

    def _run(self) -> None:
        """Connect; once connected, wait until a round trip fails, and connect again: at
        once, QUICK_TRIES times (one slow answer is no outage), then every RETRY_AFTER_S."""
        failures, ever = 0, False
        while not self._closing.is_set():
            reads = writes = None
            try:
                reads = redis_link.client(self.url, self.timeout_s)
                writes = redis_link.client(self.url, ROUND_TRIP_S)
                writes.ping()
                reads.ping()
            except Exception as exc:
                redis_link.close(*(c for c in (reads, writes) if c is not None))
                failures += 1
                if failures == QUICK_TRIES:
                    self._log_failure("connecting", exc)
                self._closing.wait(QUICK_RETRY_S if failures < QUICK_TRIES else RETRY_AFTER_S)
                continue
            if failures >= QUICK_TRIES or not ever:
                log.info("result cache %s: connected", redis_link.shown(self.url))
            failures, ever = 0, True
            self._reads, self._writes = reads, writes
            self._down.clear()
            self.connected = True
            while not self._closing.is_set() and not self._down.wait(0.1):
                pass
            self.connected = False
            self._reads = self._writes = None
            redis_link.close(reads, writes)

    def _send_lookups(self) -> None:
        while True:
            batch = redis_link.take(self._asked)
            if batch is None:
                return
            client = self._reads
            if client is None:
                found: Sequence[object] = [_FAILED] * len(batch)
            else:
                try:
                    found = cast(Sequence[object], client.mget([key for key, _ in batch]))
                except Exception as exc:
                    found = [_FAILED] * len(batch)
                    self._failed("lookup", exc)
            self._answer(_settle, batch, found)

    def _send_writes(self) -> None:
        while True:
            batch = redis_link.take(self._to_write)
            if batch is None:
                return
            client, result = self._writes, Write.ERROR
            if client is not None:
                try:
                    pipeline = client.pipeline(transaction=False)
                    for _, key, answer, ttl_ms in batch:
                        pipeline.set(key, answer, px=ttl_ms)
                    pipeline.execute()
                    result = Write.STORED
                except Exception as exc:
                    self._failed("write", exc)
            models = [model for model, *_ in batch]
            self._answer(self._written, models, result)

    def _answer(self, callback: Any, *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop closed: the process ends
            self._loop.call_soon_threadsafe(callback, *args)

    def _failed(self, doing: str, exc: Exception) -> None:
        if self.connected:
            self.connected = False  # lookups unavailable and writes dropped, at once
            self._log_failure(doing, exc)
            self._down.set()

    def _log_failure(self, doing: str, exc: Exception) -> None:
        reason = "no answer in time" if "Timeout" in type(exc).__name__ else repr(exc)
        log.warning(
            "result cache %s: %s failed (%s); the model answers until it is connected "
            "again (tried at once, then every %g s)",
            redis_link.shown(self.url),
            doing,
            reason,
            RETRY_AFTER_S,
        )

    def close(self) -> None:
        """(On a thread.) Let the writes queued go out, then stop the threads."""
        self._to_write.put(redis_link.STOP)
        self._threads["writes"].join(ROUND_TRIP_S + 1)
        self._closing.set()
        self._asked.put(redis_link.STOP)
        for thread in self._threads.values():
            thread.join(ROUND_TRIP_S + 1)


def _settle(batch: list[tuple[bytes, asyncio.Future[object]]], found: Sequence[object]) -> None:
    for (_, future), value in zip(batch, found, strict=True):
        if not future.done():  # its request may have stopped waiting
            future.set_result(value)
