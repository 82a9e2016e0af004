"""What a frontend holds while a generation is decoded: its tokens as they come, then its
result.

``async for event in stream`` yields a :class:`~serve.lm.messages.TokenEvent` per token
(when the stream was asked for tokens) and ends when the generation does;
``await stream.result()`` gives the :class:`~serve.lm.messages.GenerationResult`. Both
raise the RLServeError that ended it instead (504 past its deadline, 503 when the version
went away, ...). ``model_version`` and ``model_sha256`` are known from the first event on:
a streaming frontend can stamp its headers then. ``cancel`` gives up on it (the client
went away): the sequence leaves the batch at the next step.

The scheduler feeds it on the event loop; nothing here is thread-safe, nothing needs to be.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from kernel.errors import RLServeError
from serve.lm.messages import GenerationResult, TokenEvent

__all__ = ["GenerationStream"]


class GenerationStream:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, cancel: Callable[[], None], *, tokens: bool
    ) -> None:
        self.tokens = tokens  # whether token events are wanted (else only the result)
        self.model_version: int | None = None
        self.model_sha256 = ""
        self._loop = loop
        self._cancel = cancel
        self._events: deque[TokenEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._watcher: Callable[[], None] | None = None  # a reader of several streams
        self._done: asyncio.Future[GenerationResult] = loop.create_future()
        self._done.add_done_callback(_retrieved)

    # ------------------------------------------------------------------ the frontend's side

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> TokenEvent:
        while not self._events:
            if self._done.done():
                if self._done.exception() is not None:
                    raise self._done.exception()  # type: ignore[misc]
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._events.popleft()

    def drain(self) -> list[TokenEvent]:
        """The events already here, without waiting (a frontend writes them together)."""
        events = list(self._events)
        self._events.clear()
        return events

    async def result(self) -> GenerationResult:
        return await asyncio.shield(self._done)

    def outcome(self) -> GenerationResult:
        """The result of a generation that ended (``done``); the error that ended it is
        raised."""
        return self._done.result()

    def watch(self, wake: Callable[[], None] | None) -> None:
        """Call ``wake`` whenever events or the end arrive (None: stop), so that one reader
        of several streams waits once for all of them (``merged_streams``)."""
        self._watcher = wake

    @property
    def done(self) -> bool:
        return self._done.done()

    def cancel(self) -> None:
        """Give up on the generation: no more events; it leaves the batch."""
        if not self._done.done():
            self._cancel()

    # ------------------------------------------------------------------ the scheduler's side

    def started(self, version: int, sha256: str) -> None:
        self.model_version, self.model_sha256 = version, sha256

    def push(self, event: TokenEvent) -> None:
        if self.tokens and not self._done.done():
            self._events.append(event)
            self._wake()

    def finish(self, result: GenerationResult) -> None:
        if not self._done.done():
            self._done.set_result(result)
            self._wake()

    def fail(self, error: RLServeError) -> None:
        if not self._done.done():
            self._done.set_exception(error)
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        if self._watcher is not None:
            self._watcher()


def _retrieved(future: asyncio.Future[GenerationResult]) -> None:
    """Mark an error as seen: a stream nobody awaits any more (its client went away) must
    not log 'exception was never retrieved'."""
    if not future.cancelled():
        future.exception()
