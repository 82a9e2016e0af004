"""Several generations' streams as one sequence: every stream's tokens and result, tagged with
its index, in the order they come; the first error ends it and the other readers go."""

from __future__ import annotations

import asyncio

import pytest

from serve.errors import DeadlineExceeded
from serve.lm.frontends.merged_streams import Finished, Tokens, merged
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


async def test_each_streams_tokens_and_end_come_tagged_in_the_order_they_happen() -> None:
    first, second = stream(), stream()
    seen: list[Tokens | Finished] = []

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
        Tokens(1, [event(0, 7)]),
        Tokens(0, [event(0, 3), event(1, 4)]),  # what came together, together
        Finished(0, result(3, 4)),
        Tokens(1, [event(1, 8)]),
        Finished(1, result(7, 8)),
    ]


async def test_one_stream_is_read_as_it_is() -> None:
    only = stream()
    only.push(event(0, 3))
    only.finish(result(3))
    seen = [item async for item in merged([only])]
    assert seen == [Tokens(0, [event(0, 3)]), Finished(0, result(3))]


async def test_the_first_error_ends_it() -> None:
    first, second = stream(), stream()
    seen: list[Tokens | Finished] = []

    async def read() -> None:
        async for item in merged([first, second]):
            seen.append(item)

    reader = asyncio.ensure_future(read())
    first.push(event(0, 3))
    await settle()
    second.fail(DeadlineExceeded("no answer within the request's deadline"))
    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(reader, 5)
    assert seen == [Tokens(0, [event(0, 3)])]
    first.push(event(1, 4))  # nobody reads it any more, and nothing is left waiting on it
    await settle()
    assert first.drain() == [event(1, 4)]
