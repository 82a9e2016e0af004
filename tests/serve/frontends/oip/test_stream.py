"""A ModelStreamInfer stream's flow (serve.frontends.oip.stream), without a server: calls
read from an async iterator, answers written to a context that records them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from serve.frontends.oip.stream import InferStream


class Context:
    """What the stream asks of grpc's context: ``write``, which can be held back (a client
    that does not read)."""

    def __init__(self) -> None:
        self.written: list[Any] = []
        self.open = asyncio.Event()
        self.open.set()

    async def write(self, message: Any) -> None:
        await self.open.wait()
        self.written.append(message)


class Calls:
    """The client's side: calls sent when the test says, and the end of the stream."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.read = 0

    async def __aiter__(self) -> AsyncIterator[Any]:
        while (call := await self.queue.get()) is not None:
            self.read += 1
            yield call

    def send(self, *calls: Any) -> None:
        for call in calls:
            self.queue.put_nowait(call)

    def end(self) -> None:
        self.queue.put_nowait(None)


Reply = Callable[[Any], None]


async def settled(condition: Callable[[], bool]) -> None:
    """Turns of the event loop until ``condition`` holds (a bounded number)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def run_stream(
    stream: InferStream, calls: Calls, start: Callable[[Any, float, Reply], None]
) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
    reader = asyncio.ensure_future(stream.read(calls.__aiter__(), start))
    writer = asyncio.ensure_future(stream.write())
    return reader, writer


def test_answers_are_written_as_they_come_and_the_stream_ends_when_all_are() -> None:
    async def main() -> None:
        context, calls = Context(), Calls()
        replies: dict[str, Reply] = {}
        stream = InferStream(context, max_in_flight=8)
        reader, writer = run_stream(
            stream, calls, lambda call, _, reply: replies.update({call: reply})
        )
        calls.send("a", "b", "c")
        await settled(lambda: len(replies) == 3)
        replies["b"]("answer b")  # answered out of order: written at once
        replies["c"]("answer c")
        await settled(lambda: len(context.written) == 2)
        calls.end()
        await reader
        assert not writer.done()  # "a" is still in flight
        replies["a"]("answer a")
        await asyncio.wait_for(writer, 1)
        assert context.written == ["answer b", "answer c", "answer a"]

    asyncio.run(main())


def test_a_call_answered_while_it_is_started_is_written_too() -> None:
    async def main() -> None:
        context, calls = Context(), Calls()
        stream = InferStream(context, max_in_flight=2)
        reader, writer = run_stream(stream, calls, lambda call, _, reply: reply(f"refused {call}"))
        calls.send(*range(5))
        calls.end()
        await asyncio.wait_for(asyncio.gather(reader, writer), 1)
        assert context.written == [f"refused {i}" for i in range(5)]

    asyncio.run(main())


def test_at_the_bound_the_stream_is_not_read_until_an_answer_is_written() -> None:
    async def main() -> None:
        context, calls = Context(), Calls()
        context.open.clear()  # a client that reads nothing: no write completes
        replies: list[Reply] = []
        stream = InferStream(context, max_in_flight=3)
        reader, writer = run_stream(stream, calls, lambda _, __, reply: replies.append(reply))
        calls.send(*range(10))
        await settled(lambda: len(replies) == 3)
        for reply in replies:
            reply("answer")
        for _ in range(50):
            await asyncio.sleep(0)
        assert calls.read == 3  # answers known but not written still hold their calls
        context.open.set()
        await settled(lambda: calls.read == 6)
        assert len(context.written) == 3
        reader.cancel()  # shutdown: the stream takes no new calls
        for reply in replies[3:]:
            reply("answer")
        await asyncio.wait_for(writer, 1)
        assert len(context.written) == 6

    asyncio.run(main())


def test_a_start_that_raises_holds_no_call() -> None:
    async def main() -> None:
        context, calls = Context(), Calls()
        stream = InferStream(context, max_in_flight=4)

        def start(call: Any, _: float, reply: Reply) -> None:
            if call == "bug":
                raise RuntimeError("a bug")
            reply(f"answer {call}")

        reader, writer = run_stream(stream, calls, start)
        calls.send("a", "bug")
        with pytest.raises(RuntimeError, match="a bug"):
            await asyncio.wait_for(reader, 1)
        await asyncio.wait_for(writer, 1)  # the reading ended; nothing is left in flight
        assert context.written == ["answer a"]

    asyncio.run(main())
