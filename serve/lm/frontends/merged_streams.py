"""Several generations of one call as one sequence of what happens to them: a completions
call with several prompts streams every choice's tokens as they come, each tagged with
its choice's index.

:func:`merged` yields :class:`Tokens` (a stream's next token events, with those already
behind them) and :class:`Finished` (a stream's result, once it ended), in the order they
happen; it ends when every stream has. The first error a stream ends with is raised (the
caller gives up on the others). One stream is read directly, without a task per turn:
that is every call with one prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from serve.lm.frontends.calls import next_events
from serve.lm.messages import GenerationResult, TokenEvent
from serve.lm.scheduling.generation_stream import GenerationStream

__all__ = ["Finished", "Tokens", "merged"]


@dataclass(frozen=True, slots=True)
class Tokens:
    index: int  # the stream's position among the call's streams
    events: list[TokenEvent]


@dataclass(frozen=True, slots=True)
class Finished:
    index: int
    result: GenerationResult


async def merged(streams: Sequence[GenerationStream]) -> AsyncGenerator[Tokens | Finished, None]:
    """What happens to the streams, in order, each tagged with its stream's index."""
    if len(streams) == 1:
        (stream,) = streams
        while True:
            try:
                events = await next_events(stream)
            except StopAsyncIteration:
                yield Finished(0, await stream.result())
                return
            yield Tokens(0, events)
    reading = {asyncio.ensure_future(_next(stream)): i for i, stream in enumerate(streams)}
    try:
        while reading:
            done, _ = await asyncio.wait(reading, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=reading.__getitem__):
                index = reading.pop(task)
                read = task.result()  # the error that ended the stream, raised
                if read is None:
                    yield Finished(index, await streams[index].result())
                    continue
                reading[asyncio.ensure_future(_next(streams[index]))] = index
                yield Tokens(index, read)
    finally:
        for task in reading:
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # seen: the error raised is another stream's


async def _next(stream: GenerationStream) -> list[TokenEvent] | None:
    """The stream's next events; None at its end."""
    try:
        return await next_events(stream)
    except StopAsyncIteration:
        return None
