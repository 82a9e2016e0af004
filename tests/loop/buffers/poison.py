"""Poison for a live ``file://`` log: raw bytes appended as records between the producers'
own, under their append lock, as a foreign or broken writer would add them."""

from __future__ import annotations

import threading
from types import TracebackType

from loop.buffers.base import BufferOptions
from loop.buffers.local_log import LogProducer

POISON = b"\xc1"  # msgpack's one never-used byte: never an experience record


class Poisoner:
    """A thread that keeps one poison record in the log for every ``every`` records its
    producers published (checked every 10 ms), until the ``with`` block ends;
    ``injected`` counts them."""

    def __init__(self, url: str, every: int) -> None:
        self.every = every
        self.injected = 0
        self._producer = LogProducer(url, BufferOptions())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="poisoner", daemon=True)

    def __enter__(self) -> Poisoner:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.close()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            with self._producer._locked():  # the producers' lock, the tail caught up
                published = self._producer._next - self.injected  # the producers' records
                due = published // self.every - self.injected
                if due > 0:
                    self._producer._append([(POISON, 0)] * due)
                    self.injected += due
