"""Several generations' streams as one sequence of turns: what every stream got since the
last turn (tokens, then its end), tagged with its index; the first error ends it, and
nothing is left watching the streams."""

from __future__ import annotations

import asyncio

import pytest

from kernel.errors import DeadlineExceeded
from serve.frontends.lm.merged_streams import Finished, Tokens, Turn, merged
from serve.lm.messages import FinishReason, GenerationResult, TokenEvent
from serve.lm.scheduling.generation_stream import GenerationStream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def stream() -> GenerationStream:
    return GenerationStream(asyncio.get_running_loop(), lambda: None, tokens=True)


def event(index: int, token: int) -> TokenEvent:
    return TokenEvent(index, token, -0.5, f"t{token}")


def result(*tokens: int) -> GenerationResult:
    text = "".join(f"t{t}" for t in tokens)
    return GenerationResult("m", 1, "0" * 64, 2, tokens, (-0.5,) * len(tokens), text,
                            FinishReason.LENGTH)  # fmt: skip


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_each_turn_holds_what_every_stream_got_since_the_last() -> None:
    first, second = stream(), stream()
    seen: list[Turn] = []

    async def read() -> None:
        async for item in merged([first, second]):
            seen.append(item)

    reader = asyncio.ensure_future(read())
    await settle()
    second.push(event(0, 7))
    await settle()
    first.push(event(0, 3))
    first.push(event(1, 4))
    await settle()
    first.finish(result(3, 4))
    await settle()
    second.push(event(1, 8))
    second.finish(result(7, 8))
    await asyncio.wait_for(reader, 5)
    assert seen == [
        Turn([Tokens(1, [event(0, 7)])]),
        Turn([Tokens(0, [event(0, 3), event(1, 4)])]),  # what came together, together
        Turn([], [Finished(0, result(3, 4))]),
        Turn([Tokens(1, [event(1, 8)])], [Finished(1, result(7, 8))]),
    ]


async def test_a_step_of_every_choice_is_one_turn() -> None:
    streams = [stream() for _ in range(4)]
    seen: list[Turn] = []

    async def read() -> None:
        async for turn in merged(streams):
            seen.append(turn)

    reader = asyncio.ensure_future(read())
    await settle()
    for step in range(2):  # as the decoding thread hands a step over: every choice at once
        for index, one in enumerate(streams):
            one.push(event(step, 10 * index + step))
        await settle()
    for index, one in enumerate(streams):
        one.finish(result(10 * index, 10 * index + 1))
    await asyncio.wait_for(reader, 5)
    assert seen == [
        Turn([Tokens(i, [event(step, 10 * i + step)]) for i in range(4)]) for step in range(2)
    ] + [Turn([], [Finished(i, result(10 * i, 10 * i + 1)) for i in range(4)])]


async def test_one_stream_is_read_as_it_is() -> None:
    only = stream()
    only.push(event(0, 3))
    only.finish(result(3))
    seen = [turn async for turn in merged([only])]
    assert seen == [Turn([Tokens(0, [event(0, 3)])], [Finished(0, result(3))])]


async def test_the_first_error_ends_it() -> None:
    first, second = stream(), stream()
    seen: list[Turn] = []

    async def read() -> None:
        async for item in merged([first, second]):
            seen.append(item)

    reader = asyncio.ensure_future(read())
    first.push(event(0, 3))
    await settle()
    second.fail(DeadlineExceeded("no answer within the request's deadline"))
    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(reader, 5)
    assert seen == [Turn([Tokens(0, [event(0, 3)])])]
    first.push(event(1, 4))  # nobody reads it any more, and nothing is left waiting on it
    await settle()
    assert first.drain() == [event(1, 4)]
