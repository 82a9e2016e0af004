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

Redis down or slow never fails a request: a lookup that errs or times out counts an error
and the model runs; after an error the cache is not asked again for ``RETRY_AFTER_S`` (the
lookups meanwhile count ``unavailable``), so a black-holed Redis costs one timeout a second,
not one per request. The client (``redis.asyncio``, the ``cache`` extra) is imported when a
model with a cache first asks: a server without one never imports it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from serve.config import ModelSettings
from serve.dataplane.messages import Prepared
from serve.metrics import Metrics

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("rlserve.result_cache")

KEY_PREFIX = b"rlserve:result:"
DIGEST_BYTES = 16  # BLAKE2b-128: 2^-64 odds of a collision among 2^32 cached answers
RETRY_AFTER_S = 1.0  # after a failed lookup or write, the cache is left alone this long
WRITE_TIMEOUT_S = 1.0  # a write still unanswered after this is dropped (and counted)
MAX_PENDING_WRITES = 256  # writes in flight per process; more are dropped (and counted)
MAX_CONNECTIONS = 64  # per Redis URL and process; a lookup finding none free is an error


class Lookup(StrEnum):
    """What a lookup found: the ``result`` label of ``rlserve_result_cache_lookups_total``."""

    HIT = "hit"
    MISS = "miss"
    ERROR = "error"  # Redis failed or did not answer within result_cache_timeout_ms
    UNAVAILABLE = "unavailable"  # not asked: it failed less than RETRY_AFTER_S ago


class Write(StrEnum):
    """What became of an answer to store: ``rlserve_result_cache_writes_total``'s label."""

    STORED = "stored"
    TOO_LARGE = "too_large"  # over result_cache_max_entry_bytes
    DROPPED = "dropped"  # MAX_PENDING_WRITES in flight, or Redis failed lately
    ERROR = "error"


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
    """The result caches of one process's predict frontend: a Redis client per URL (made
    when first needed, on the running event loop), the writes in flight, and whether each
    Redis failed lately."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._clients: dict[str, Redis] = {}
        self._failed_at: dict[str, float] = {}  # by URL: monotonic seconds of the last error
        self._writes: set[asyncio.Task[None]] = set()

    async def lookup(self, model: str, settings: CacheSettings, key: bytes) -> bytes | None:
        """The cached answer, or None (the model must run): never raises."""
        result, found = await self._lookup(settings, key)
        self._metrics.result_cache_lookup(model, result.value)
        return found

    async def _lookup(self, settings: CacheSettings, key: bytes) -> tuple[Lookup, bytes | None]:
        if self._failing(settings.url):
            return Lookup.UNAVAILABLE, None
        try:
            client = self._client(settings.url)
            async with asyncio.timeout(settings.timeout_s):
                found = await client.get(key)
        except Exception as exc:  # Redis down, slow, refusing: the model answers instead
            self._failed(settings.url, "lookup", exc)
            return Lookup.ERROR, None
        if not isinstance(found, bytes):  # None: not there (or expired)
            return Lookup.MISS, None
        return Lookup.HIT, found

    def store(self, model: str, settings: CacheSettings, key: bytes, answer: bytes) -> None:
        """Write an answer in the background (the caller does not wait): never raises."""
        if len(answer) > settings.max_entry_bytes:
            self._metrics.result_cache_write(model, Write.TOO_LARGE.value)
            return
        if len(self._writes) >= MAX_PENDING_WRITES or self._failing(settings.url):
            self._metrics.result_cache_write(model, Write.DROPPED.value)
            return
        task = asyncio.get_running_loop().create_task(self._store(model, settings, key, answer))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _store(self, model: str, settings: CacheSettings, key: bytes, answer: bytes) -> None:
        try:
            client = self._client(settings.url)
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await client.set(key, answer, px=settings.ttl_ms)
        except Exception as exc:
            self._failed(settings.url, "write", exc)
            self._metrics.result_cache_write(model, Write.ERROR.value)
            return
        self._metrics.result_cache_write(model, Write.STORED.value)

    async def close(self) -> None:
        """Let the writes in flight finish (each within WRITE_TIMEOUT_S), close the clients."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                await client.aclose()
            except Exception as exc:
                log.warning("result cache: closing a client failed: %s", exc)

    def _client(self, url: str) -> Redis:
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = _connect(url)
        return client

    def _failing(self, url: str) -> bool:
        failed_at = self._failed_at.get(url)
        return failed_at is not None and time.monotonic() - failed_at < RETRY_AFTER_S

    def _failed(self, url: str, doing: str, exc: Exception) -> None:
        if not self._failing(url):  # once per RETRY_AFTER_S, not per request
            reason = type(exc).__name__ if isinstance(exc, TimeoutError) else repr(exc)
            log.warning(
                "result cache %s: %s failed (%s); the model answers, and the cache is asked "
                "again in %g s",
                _shown(url),
                doing,
                reason,
                RETRY_AFTER_S,
            )
        self._failed_at[url] = time.monotonic()


def _connect(url: str) -> Redis:
    """A client for ``url``: no retries (a lookup has milliseconds), bounded connections."""
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(
        url,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=WRITE_TIMEOUT_S,
        socket_connect_timeout=WRITE_TIMEOUT_S,
        max_connections=MAX_CONNECTIONS,
    )


def _shown(url: str) -> str:
    """The URL without a password, for the log."""
    scheme, sep, rest = url.partition("://")
    credentials, at, where = rest.rpartition("@")
    return f"{scheme}{sep}{'***@' if at else ''}{where}" if credentials or at else url
