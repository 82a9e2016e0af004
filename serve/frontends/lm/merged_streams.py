"""Several generations of one call as one sequence of turns: a group of ``n`` choices, or a
completions call with several prompts, streams every choice's tokens as they come, each
tagged with its choice's index.

:func:`merged` yields a :class:`Turn` whenever something happened to the streams: the token
events each stream got since the last turn (:class:`Tokens`) and the results of those that
ended (:class:`Finished`), by stream index. The decoding thread hands every sequence's token
of a step over at once, so a turn holds the step's tokens of every choice, and a frontend
writes it as one chunk: a group costs one write per step, not one per choice. The reader
waits once for all the streams (each calls its watcher when something arrives), without a
task per stream. The first error a stream ends with is raised (the caller gives up on the
others).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from serve.lm.messages import GenerationResult, TokenEvent
from serve.lm.scheduling.generation_stream import GenerationStream

__all__ = ["Finished", "Tokens", "Turn", "merged"]


@dataclass(frozen=True, slots=True)
class Tokens:
    index: int  # the stream's position among the call's streams
    events: list[TokenEvent]


@dataclass(frozen=True, slots=True)
class Finished:
    index: int
    result: GenerationResult


@dataclass(frozen=True, slots=True)
class Turn:
    """What happened since the last turn: a stream's tokens come before its end."""

    tokens: list[Tokens] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)


async def merged(streams: Sequence[GenerationStream]) -> AsyncGenerator[Turn, None]:
    """The streams' turns until every stream has ended."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] | None = None

    def wake() -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    for stream in streams:
        stream.watch(wake)
    running = list(range(len(streams)))
    try:
        while running:
            turn, running = _turn(streams, running)
            if turn.tokens or turn.finished:
                yield turn
                continue
            waiter = loop.create_future()
            try:
                await waiter
            finally:
                waiter = None
    finally:
        for stream in streams:
            stream.watch(None)


def _turn(streams: Sequence[GenerationStream], running: list[int]) -> tuple[Turn, list[int]]:
    """What the running streams got, and those still running after it."""
    turn, still = Turn(), []
    for index in running:
        stream = streams[index]
        events = stream.drain()
        if events:
            turn.tokens.append(Tokens(index, events))
        if stream.done:
            turn.finished.append(Finished(index, stream.outcome()))  # an error: raised
        else:
            still.append(index)
    return turn, still
