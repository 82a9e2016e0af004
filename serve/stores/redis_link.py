"""What every Redis link of the data plane shares (the result cache's, a feature store's):
a client with one connection and no retries, a queue drained a round trip at a time, and
URLs shown without their credentials.

A link's thread owns its client: a round trip that fails takes the link down and the thread
connects again, so no caller ever waits for a connection to open. redis-py (the ``cache``
extra) is imported when a link is first made: a server without one never imports it.
"""

from __future__ import annotations

import logging
import queue
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis import Redis

log = logging.getLogger("rlserve.redis")

CONNECT_S = 1.0  # connecting may take this long
MAX_BATCH = 512  # items of one round trip
STOP = object()  # tells a link's thread to end


def client(url: str, timeout_s: float) -> Redis:
    """A client for ``url`` with one connection, no retries (a failed round trip takes the
    link down, and it connects again), answering within ``timeout_s``."""
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Redis.from_url(
        url,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=timeout_s,
        socket_connect_timeout=CONNECT_S,
        single_connection_client=True,
    )


def take(waiting: queue.SimpleQueue[Any]) -> list[Any] | None:
    """What waits in ``waiting`` (blocking for the first; MAX_BATCH at most); None: stop."""
    first = waiting.get()
    if first is STOP:
        return None
    batch = [first]
    while len(batch) < MAX_BATCH:
        try:
            item = waiting.get_nowait()
        except queue.Empty:
            break
        if item is STOP:
            waiting.put(STOP)  # end after this batch
            break
        batch.append(item)
    return batch


def close(*clients: Redis) -> None:
    for each in clients:
        try:
            each.close()
        except Exception as exc:
            log.debug("closing a Redis client: %r", exc)


def shown(url: str) -> str:
    """The URL without its credentials or query (a password may be in either), for the log."""
    scheme, sep, rest = url.partition("://")
    rest = rest.partition("?")[0]
    _, at, where = rest.rpartition("@")
    return f"{scheme}{sep}{'***@' if at else ''}{where}"
