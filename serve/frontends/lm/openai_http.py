"""The OpenAI-compatible frontend of language models:

    POST /v1/completions         a prompt's completion
    POST /v1/chat/completions    the assistant's answer to chat messages

so that OpenAI clients work unchanged (``OpenAI(base_url="http://host:8000/v1")``); the
model is the rlserve model's name, its active version generates. Requests are checked
and translated by ``serve.frontends.lm.openai_requests``, answers written by
``serve.frontends.lm.openai_answers``; decoding is the native generate route's (the same
scheduler, batches, deadlines, 429, 503, drain and metrics: ``serve.frontends.lm.calls``).

With ``"stream": true`` the answer is server-sent events as OpenAI writes them: one
``data: {chunk}`` per token that adds text, a chunk with the finish reason, the token
counts when ``stream_options.include_usage`` is set, then ``data: [DONE]``. The head (and
its stamp) goes out once the first token exists, so an error before it is an ordinary
error answer; an error after it is a ``data: {"error": ...}`` event before ``[DONE]``.

Answers are stamped: ``system_fingerprint`` is ``rlserve-<model>-v<version>``, and the
headers X-Policy-Version and X-Policy-SHA256 name the version that generated them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from kernel.errors import InvalidInput, RLServeError, quoted
from serve.frontends.http_calls import Disconnected, Exchange, allow, stamp
from serve.frontends.lm.calls import (
    SSE_HEADERS,
    Admitted,
    CancelOnDisconnect,
    LanguageModelCalls,
    answer_tokens,
    json_answer,
)
from serve.frontends.lm.merged_streams import merged
from serve.frontends.lm.openai_answers import Answer, error
from serve.frontends.lm.openai_requests import Endpoint, OpenAICall, parse
from serve.lm.messages import Generation, GenerationResult, GenerationSpec
from serve.lm.requests import generation_spec
from serve.lm.scheduling.generation_stream import GenerationStream

__all__ = ["Endpoint", "OpenAIFrontend", "match"]

_ENDPOINTS = {endpoint.value: endpoint for endpoint in Endpoint}
_DONE = b"data: [DONE]\n\n"


PREFIXES = tuple(_ENDPOINTS)  # the exact paths match() takes


def match(path: str) -> Endpoint | None:
    """The OpenAI route a path names, or None for any other path."""
    return _ENDPOINTS.get(path)


class OpenAIFrontend:
    def __init__(self, calls: LanguageModelCalls) -> None:
        self.calls = calls

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, endpoint: Endpoint
    ) -> None:
        async def handle(exchange: Exchange) -> None:
            allow(scope, "POST")
            await self._complete(exchange, endpoint)

        await self.calls.http.serve(scope, receive, send, handle, error)

    async def _complete(self, exchange: Exchange, endpoint: Endpoint) -> None:
        call = exchange.call
        created = int(time.time())
        payload = await self.calls.decode(exchange, await self.calls.read(exchange))
        request = parse(endpoint, payload)
        admitted = self.calls.route(call, request.model, None, f"POST {endpoint.value}")
        choices = len(request.bodies)
        bound = admitted.scheduler.max_queue_rows
        if choices > bound and request.n > 1:
            raise InvalidInput(
                f"n: {choices} choices asked ({request.n} per prompt); model "
                f"{quoted(admitted.model)} queues at most {bound} requests (its "
                "max_queue_rows setting), and each choice is one: ask for fewer"
            )
        if choices > bound:
            raise InvalidInput(
                f"prompt: {choices} prompts given; model {quoted(admitted.model)} queues "
                f"at most {bound} requests (its max_queue_rows setting), and each prompt is "
                "one: send fewer prompts per call"
            )
        # overloaded: refuse before tokenizing
        self.calls.admit(admitted, "reading the body", choices)
        streaming = request.options.stream
        specs = self._specs(exchange, request, admitted)
        generations = await self.calls.prepare(exchange, self._preparer(request, admitted), specs)
        streams = self.calls.queue(admitted, generations, tokens=streaming)
        answer = Answer(
            endpoint,
            call.request_id,
            created,
            admitted.model,
            request.options.logprobs,
            request.options.include_usage,
            choices=choices,
            top_logprobs=specs[0].top_logprobs,  # every prompt's body asks the same
            echo=specs[0].echo,
            token_ids=request.options.token_ids,
            n=request.n,
        )
        with CancelOnDisconnect(exchange.receive, *streams) as watch:
            try:
                if streaming:
                    await self._stream(exchange, admitted, streams, answer, watch)
                    return
                results = [await stream.result() for stream in streams]
            except RLServeError:
                _give_up(streams)
                if watch.gone:
                    raise Disconnected from None  # nobody is left to answer
                raise
        first = results[0]
        if answer.logprobs or answer.echo:
            answer.codec = self.calls.codec(admitted, first.version)
        await json_answer(
            exchange,
            answer_tokens(generations),
            lambda: answer.body(results),
            stamp(first.version, first.sha256),
        )

    async def _stream(
        self,
        exchange: Exchange,
        admitted: Admitted,
        streams: list[GenerationStream],
        answer: Answer,
        watch: CancelOnDisconnect,
    ) -> None:
        """Every choice's chunks as its tokens come (several prompts: interleaved, each
        with its index), each choice's finish reason, then the token counts of all."""
        results: list[GenerationResult | None] = [None] * len(streams)
        async with aclosing(merged(streams)) as turns:
            turn = await anext(turns)  # raises the error that ends a stream before any token
            first = streams[(turn.tokens or turn.finished)[0].index]
            version = first.model_version or 0
            if answer.logprobs:
                answer.codec = self.calls.codec(admitted, version)
            await exchange.start(200, [*SSE_HEADERS, *stamp(version, first.model_sha256)])
            held = b""  # finish chunks, written with what comes next
            try:
                while True:
                    chunks = []
                    for tokens in turn.tokens:  # every choice's tokens of the turn: one write
                        version = streams[tokens.index].model_version or version
                        chunks.extend(answer.chunks(version, tokens.events, tokens.index))
                    if chunks:
                        await exchange.chunk(held + _data(chunks))
                        held = b""
                    for ended in turn.finished:
                        results[ended.index] = ended.result
                        held += _data([answer.finished(ended.result, ended.index)])
                    turn = await anext(turns)
            except StopAsyncIteration:
                done = [result for result in results if result is not None]
                await exchange.chunk(held + _data(answer.end(done)) + _DONE, last=True)
            except RLServeError as exc:
                _give_up(streams)
                if watch.gone:
                    raise Disconnected from None
                failure = error(exc)
                self.calls.http.refused(exchange.call, exc, failure.status)
                await exchange.chunk(held + _data([failure.body]) + _DONE, last=True)

    @staticmethod
    def _specs(exchange: Exchange, request: OpenAICall, admitted: Admitted) -> list[GenerationSpec]:
        call = exchange.call
        specs = []
        for index, body in enumerate(request.bodies):
            try:
                spec = generation_spec(
                    dict(body), call.request_id, call.received_at, admitted.deadline.at
                )
            except InvalidInput as exc:
                raise request.renamed(exc, index) from None
            specs.append(spec)
        return specs

    @staticmethod
    def _preparer(
        request: OpenAICall, admitted: Admitted
    ) -> Callable[[list[GenerationSpec]], list[Generation]]:
        """Tokenize (or check) every choice's prompt on the version the call was routed
        to, the errors naming the OpenAI fields."""

        def prepare(specs: list[GenerationSpec]) -> list[Generation]:
            generations: list[Generation] = []
            for index, spec in enumerate(specs):
                like = generations[-1] if generations else None  # n choices: tokenized once
                try:
                    generations.append(admitted.version.prepare_generation(spec, like=like))
                except InvalidInput as exc:
                    raise request.renamed(exc, index) from None
            return generations

        return prepare


def _give_up(streams: list[GenerationStream]) -> None:
    """One choice failed: the call fails, and the others leave the batch."""
    for stream in streams:
        stream.cancel()


def _data(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)
