"""Traffic from threads that open a new connection for every request, so that every request
can land on any gunicorn worker (locust's users keep theirs alive)."""

from __future__ import annotations

import threading
from collections import Counter

import httpx

OBSERVATION = {"observations": [0.01, -0.02, 0.03, 0.04]}
PREDICT = "/v1/models/cartpole/predict"


class FreshConnections:
    """``threads`` senders, each stopping after ``per_thread`` requests or at ``stop()``.

    ``results`` counts answers by status ("200", "503", ...), "refused" when the server was
    not listening, and "lost: <error>" for a connection that failed mid-request.
    """

    def __init__(self, url: str, threads: int = 4, per_thread: int | None = None) -> None:
        self.url, self.per_thread = url, per_thread
        self.results: Counter[str] = Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        headers = {"Connection": "close"}
        with httpx.Client(base_url=self.url, timeout=10, headers=headers) as client:
            sent = 0
            while not self._stop.is_set() and sent != self.per_thread:
                self.results[_outcome(client)] += 1
                sent += 1

    def stop(self) -> Counter[str]:
        self._stop.set()
        return self.join()

    def join(self) -> Counter[str]:
        for thread in self._threads:
            thread.join()
        return self.results


def _outcome(client: httpx.Client) -> str:
    try:
        return str(client.post(PREDICT, json=OBSERVATION).status_code)
    except httpx.ConnectError:
        return "refused"
    except httpx.TransportError as exc:
        return f"lost: {type(exc).__name__}"
