"""One ``ModelStreamInfer`` stream's flow: calls read as they come, answers written as
they are known, and no task per call.

A stream carries many small calls (an actor stepping its environments), so what each call
costs besides its batch is the stream's cost. The stream's handler writes and one task
reads; a call read is started at once (``Start``: its steps run on the loop and its answer
comes back through ``reply``, from its batch's future when the batch is done), so a call
makes no task, lock or semaphore of its own: the reader and the writer sleep on a future
only when they have nothing to do.

At most ``max_in_flight`` calls are between being read and their answer being written (an
answer waiting for the client to read it counts): at the bound the reader waits for a
write, and grpc's flow control holds the client's writes back meanwhile. When the reader
ends (the client's end of stream, or its cancellation at shutdown:
``InferenceService.close_streams``) the calls in flight are answered, then the handler
returns and the stream ends.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

# (request, received at, reply): starts one call; its answer (a ModelStreamInferResponse)
# is passed to ``reply`` exactly once, now or later.
Start = Callable[[Any, float, Callable[[Any], None]], None]


class InferStream:
    """The calls of one stream between being read and their answer being written."""

    def __init__(self, context: Any, max_in_flight: int) -> None:
        self._context = context  # the stream's grpc context: its writes
        self._max_in_flight = max_in_flight
        self._in_flight = 0  # calls read whose answer is not written yet
        self._answers: deque[Any] = deque()  # known, not written yet
        self._writer_waits: asyncio.Future[None] | None = None
        self._reader_waits: asyncio.Future[None] | None = None
        self._reading_done = False

    async def read(self, requests: AsyncIterator[Any], start: Start) -> None:
        """Start every call the client sends, holding off at the bound; ends at the
        client's end of stream (or when cancelled: shutdown)."""
        try:
            async for request in requests:
                self._in_flight += 1
                try:
                    start(request, time.monotonic(), self.reply)
                except BaseException:  # a bug of the start's: no answer will come
                    self._in_flight -= 1
                    raise
                if self._in_flight >= self._max_in_flight:
                    self._reader_waits = asyncio.get_running_loop().create_future()
                    await self._reader_waits
        finally:
            self._reading_done = True
            self._wake_writer()

    def reply(self, answer: Any) -> None:
        """A call's answer, to be written in its turn."""
        self._answers.append(answer)
        self._wake_writer()

    async def write(self) -> None:
        """Write answers as they come until the reading is done and every call read is
        answered."""
        while True:
            while self._answers:
                await self._context.write(self._answers.popleft())  # waits on a slow reader
                self._in_flight -= 1
                if self._in_flight < self._max_in_flight:
                    waiting, self._reader_waits = self._reader_waits, None
                    _wake(waiting)
            if self._reading_done and self._in_flight == 0:
                return
            self._writer_waits = asyncio.get_running_loop().create_future()
            await self._writer_waits

    def _wake_writer(self) -> None:
        waiting, self._writer_waits = self._writer_waits, None
        _wake(waiting)


def _wake(waiting: asyncio.Future[None] | None) -> None:
    """Wake the end sleeping on ``waiting`` (None: it is not sleeping)."""
    if waiting is not None and not waiting.done():
        waiting.set_result(None)
