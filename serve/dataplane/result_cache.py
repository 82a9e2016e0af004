"""The result cache: repeated deterministic predict answers served from Redis (optional,
per model: ``result_cache: redis://host:port/db``).

The predict frontend (``serve.dataplane.http``) asks it around submission to the scheduler,
which never knows it exists:

1. once a request is validated, :func:`cache_key` names its answer, or says it has none
   (sampled or seeded actions always run the model). The key holds the model, the version
   and its sha256 (a new version is a new key space: a swap can never serve a stale answer),
   and a BLAKE2b digest of what decides the answer: the observations exactly as the model
   sees them (the graph's input arrays after decoding, validation and ``observation_bounds``
   clipping: their dtype, shape and bytes, so two JSON spellings of one observation share a
   key), actions given to score, the requested outputs, and whether the answer has a batch
   axis;
2. :meth:`ResultCache.lookup` asks Redis within ``result_cache_timeout_ms``; a hit is the
   encoded answer itself, returned as the model's answer was;
3. on a miss the model runs and :meth:`ResultCache.store` hands the encoded answer to a task
   that writes it with the TTL (fire-and-forget: the request never waits for it). Only
   answers computed by the version the key names are stored, and never errors.

The request path never talks to Redis itself. Each Redis URL has a :class:`_Link`: two
connections of its own, opened and re-opened in the background, and two tasks that send
what requests queued: the keys asked for since the last round trip as one ``MGET``, the
answers to store as one pipeline of ``SET ... PX``. Under load a round trip serves many
requests, and no request ever waits for a connection to open.

Redis down or slow never fails a request: while a link is not connected its lookups are
not asked (``unavailable``) and its writes are dropped; a lookup unanswered within
``result_cache_timeout_ms`` counts an error and the model runs; after
``FAILURES_TO_BACK_OFF`` such errors in a row the cache is left alone for ``RETRY_AFTER_S``
(so a slow Redis costs a timeout a second, not one per request; one slow answer on a busy
host costs its own request alone). A round trip that fails or takes longer than
``ROUND_TRIP_S`` closes the link's connections; it connects again every ``RETRY_AFTER_S``.
The client (``redis.asyncio``, the ``cache`` extra) is imported when a model with a cache
first asks: a server without one never imports it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from serve.config import ModelSettings
from serve.dataplane.messages import Prepared
from serve.metrics import Metrics

if TYPE_CHECKING:
    from redis.asyncio import Redis

_FAILED = object()  # a lookup's result when its round trip failed

log = logging.getLogger("rlserve.result_cache")

KEY_PREFIX = b"rlserve:result:"
DIGEST_BYTES = 16  # BLAKE2b-128: 2^-64 odds of a collision among 2^32 cached answers
FAILURES_TO_BACK_OFF = 3  # lookups timed out in a row before the cache is left alone
RETRY_AFTER_S = 1.0  # for this long; a link not connected tries again this often
ROUND_TRIP_S = 1.0  # a link's MGET or SET pipeline (or connecting) may take this long
MAX_PENDING_WRITES = 1024  # answers waiting to be written, per link; more are dropped
MAX_BATCH = 512  # keys in one MGET, answers in one pipeline


class Lookup(StrEnum):
    """What a lookup found: the ``result`` label of ``rlserve_result_cache_lookups_total``."""

    HIT = "hit"
    MISS = "miss"
    ERROR = "error"  # Redis failed or did not answer within result_cache_timeout_ms
    UNAVAILABLE = "unavailable"  # not asked: not connected, or kept timing out just now


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
    must come from the model every time (sampled or seeded actions)."""
    options = prepared.options
    if not options.deterministic or options.seed is not None:
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
    (made when a model first asks, on the running event loop)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._links: dict[str, _Link] = {}

    async def lookup(self, model: str, settings: CacheSettings, key: bytes) -> bytes | None:
        """The cached answer, or None (the model must run): never raises."""
        result, found = await self._link(settings.url).lookup(key, settings.timeout_s)
        self._metrics.result_cache_lookup(model, result.value)
        return found

    def store(self, model: str, settings: CacheSettings, key: bytes, answer: bytes) -> None:
        """Queue an answer to be written (the caller does not wait): never raises."""
        if len(answer) > settings.max_entry_bytes:
            self._metrics.result_cache_write(model, Write.TOO_LARGE.value)
            return
        if not self._link(settings.url).store(model, key, answer, settings.ttl_ms):
            self._metrics.result_cache_write(model, Write.DROPPED.value)

    def connected(self, url: str) -> bool:
        """Whether this process is connected to the cache at ``url`` (a link connects, in
        the background, when a model first asks: until then its requests run the model)."""
        link = self._links.get(url)
        return link is not None and link.connected

    async def close(self) -> None:
        """Write what is queued (within ROUND_TRIP_S), then close every link."""
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.close() for link in links))

    def _link(self, url: str) -> _Link:
        link = self._links.get(url)
        if link is None:
            link = self._links[url] = _Link(url, self._metrics)
        return link


class _Link:
    """One Redis, as one process uses it: a connection for lookups and one for writes,
    each with the task that sends what requests queued, and a task that (re)connects."""

    def __init__(self, url: str, metrics: Metrics) -> None:
        self.url = url
        self._metrics = metrics
        self._reads: Redis | None = None  # set while connected
        self._writes: Redis | None = None
        self._asked: list[tuple[bytes, asyncio.Future[object]]] = []
        self._to_write: deque[tuple[str, bytes, bytes, int]] = deque()  # model, key, answer, ms
        self._asking = asyncio.Event()
        self._writing = asyncio.Event()
        self._timeouts = 0  # lookups timed out in a row
        self._left_alone_until = 0.0  # monotonic seconds
        self._broken = asyncio.Event()
        self._tasks = [
            asyncio.get_running_loop().create_task(coroutine, name=f"rlserve-cache-{name}")
            for name, coroutine in [
                ("connect", self._connect()),
                ("lookups", self._send_lookups()),
                ("writes", self._send_writes()),
            ]
        ]

    @property
    def connected(self) -> bool:
        return self._reads is not None

    async def lookup(self, key: bytes, timeout_s: float) -> tuple[Lookup, bytes | None]:
        if not self.connected or time.monotonic() < self._left_alone_until:
            return Lookup.UNAVAILABLE, None
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._asked.append((key, future))
        self._asking.set()
        try:
            async with asyncio.timeout(timeout_s):
                found = await future
        except TimeoutError:
            self._timeouts += 1
            if self._timeouts >= FAILURES_TO_BACK_OFF:
                self._timeouts = 0
                self._left_alone_until = time.monotonic() + RETRY_AFTER_S
                log.warning(
                    "result cache %s: %d lookups in a row unanswered within their timeout; "
                    "left alone for %g s",
                    _shown(self.url),
                    FAILURES_TO_BACK_OFF,
                    RETRY_AFTER_S,
                )
            return Lookup.ERROR, None
        self._timeouts = 0
        if found is _FAILED:
            return Lookup.ERROR, None
        if not isinstance(found, bytes):  # None: not there (or expired)
            return Lookup.MISS, None
        return Lookup.HIT, found

    def store(self, model: str, key: bytes, answer: bytes, ttl_ms: int) -> bool:
        """Queue a write; False (dropped) while not connected or when too many wait."""
        if not self.connected or len(self._to_write) >= MAX_PENDING_WRITES:
            return False
        self._to_write.append((model, key, answer, ttl_ms))
        self._writing.set()
        return True

    async def _connect(self) -> None:
        """Connect; once connected, wait until a round trip fails, and connect again."""
        while True:
            reads, writes = _client(self.url), _client(self.url)
            try:
                async with asyncio.timeout(ROUND_TRIP_S):
                    await asyncio.gather(reads.ping(), writes.ping())
            except Exception as exc:
                await _close(reads, writes)
                self._log_failure("connecting", exc)
                await asyncio.sleep(RETRY_AFTER_S)
                continue
            self._broken.clear()
            self._reads, self._writes = reads, writes
            log.info("result cache %s: connected", _shown(self.url))
            await self._broken.wait()
            self._reads = self._writes = None
            await _close(reads, writes)
            await asyncio.sleep(RETRY_AFTER_S)

    async def _send_lookups(self) -> None:
        while True:
            await self._asking.wait()
            self._asking.clear()
            asked, self._asked = self._asked[:MAX_BATCH], self._asked[MAX_BATCH:]
            if self._asked:
                self._asking.set()
            waiting = [(key, future) for key, future in asked if not future.done()]
            client = self._reads
            if not waiting:
                continue
            if client is None:
                _settle(waiting, [_FAILED] * len(waiting))
                continue
            try:
                async with asyncio.timeout(ROUND_TRIP_S):
                    found = await client.mget([key for key, _ in waiting])
            except Exception as exc:
                _settle(waiting, [_FAILED] * len(waiting))
                self._round_trip_failed("lookup", exc)
                continue
            _settle(waiting, found)

    async def _send_writes(self) -> None:
        while True:
            await self._writing.wait()
            self._writing.clear()
            batch = [self._to_write.popleft() for _ in range(min(MAX_BATCH, len(self._to_write)))]
            if self._to_write:
                self._writing.set()
            client = self._writes
            if not batch:
                continue
            result = Write.ERROR
            if client is not None:
                pipeline = client.pipeline(transaction=False)
                for _, key, answer, ttl_ms in batch:
                    pipeline.set(key, answer, px=ttl_ms)
                try:
                    async with asyncio.timeout(ROUND_TRIP_S):
                        await pipeline.execute()
                    result = Write.STORED
                except Exception as exc:
                    self._round_trip_failed("write", exc)
            for model, *_ in batch:
                self._metrics.result_cache_write(model, result.value)

    def _round_trip_failed(self, doing: str, exc: Exception) -> None:
        if self.connected:
            self._log_failure(doing, exc)
            self._reads = self._writes = None  # lookups unavailable, writes dropped, at once
            self._broken.set()

    def _log_failure(self, doing: str, exc: Exception) -> None:
        reason = "no answer in time" if isinstance(exc, TimeoutError) else repr(exc)
        log.warning(
            "result cache %s: %s failed (%s); the model answers meanwhile, and the cache "
            "connects again in %g s",
            _shown(self.url),
            doing,
            reason,
            RETRY_AFTER_S,
        )

    async def close(self) -> None:
        if self._to_write and self._writes is not None:
            try:
                async with asyncio.timeout(ROUND_TRIP_S):
                    while self._to_write:
                        await asyncio.sleep(0.001)
                    await asyncio.sleep(0.001)  # the last pipeline's answer
            except TimeoutError:
                pass
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        clients = [c for c in (self._reads, self._writes) if c is not None]
        self._reads = self._writes = None
        await _close(*clients)


def _settle(waiting: list[tuple[bytes, asyncio.Future[object]]], found: Sequence[object]) -> None:
    for (_, future), value in zip(waiting, found, strict=True):
        if not future.done():  # its request may have stopped waiting (its timeout)
            future.set_result(value)


def _client(url: str) -> Redis:
    """A client for ``url`` holding one connection, with no retries (a failed round trip
    reconnects the link)."""
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(
        url,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=ROUND_TRIP_S,
        socket_connect_timeout=ROUND_TRIP_S,
        max_connections=1,
    )


async def _close(*clients: Redis) -> None:
    for client in clients:
        try:
            await client.aclose()
        except Exception as exc:
            log.debug("result cache: closing a client: %r", exc)


def _shown(url: str) -> str:
    """The URL without a password, for the log."""
    scheme, sep, rest = url.partition("://")
    credentials, at, where = rest.rpartition("@")
    return f"{scheme}{sep}{'***@' if at else ''}{where}" if credentials or at else url
