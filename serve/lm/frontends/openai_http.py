"""The OpenAI-compatible frontend of language models:

    POST /v1/completions         a prompt's completion
    POST /v1/chat/completions    the assistant's answer to chat messages

so that OpenAI clients work unchanged (``OpenAI(base_url="http://host:8000/v1")``); the
model is the rlserve model's name, its active version generates. Requests are checked
and translated by ``serve.lm.frontends.openai_requests``, answers written by
``serve.lm.frontends.openai_answers``; decoding is the native generate route's (the same
scheduler, batches, deadlines, 429, 503, drain and metrics: ``serve.lm.frontends.calls``).

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
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from serve.dataplane.http_calls import Disconnected, Exchange, stamp
from serve.errors import InvalidInput, MethodNotAllowed, RLServeError
from serve.lm.frontends.calls import (
    SSE_HEADERS,
    Admitted,
    CancelOnDisconnect,
    LanguageModelCalls,
    generation_parts,
    next_events,
)
from serve.lm.frontends.openai_answers import Answer, error
from serve.lm.frontends.openai_requests import Endpoint, OpenAICall, parse
from serve.lm.messages import GenerationSpec
from serve.lm.requests import generation_spec
from serve.lm.scheduling.generation_stream import GenerationStream
from serve.lm.text import TextCodec

__all__ = ["Endpoint", "OpenAIFrontend", "match"]

_ENDPOINTS = {endpoint.value: endpoint for endpoint in Endpoint}
_DONE = b"data: [DONE]\n\n"


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
            if scope["method"] != "POST":
                raise MethodNotAllowed(
                    f"{scope['method']} {scope['path']}: this route accepts POST only"
                )
            await self._complete(exchange, endpoint)

        await self.calls.http.serve(scope, receive, send, handle, error)

    async def _complete(self, exchange: Exchange, endpoint: Endpoint) -> None:
        call = exchange.call
        created = int(time.time())
        payload = await self.calls.decode(exchange, await self.calls.read(exchange))
        request = parse(endpoint, payload)
        admitted = self.calls.route(call, request.model, None, f"POST {endpoint.value}")
        self.calls.admit(admitted, "reading the body")  # overloaded: refuse before tokenizing
        streaming = request.options.stream
        try:
            spec = self._spec(exchange, request, admitted)
            stream = await self.calls.submit(exchange, admitted, spec, tokens=streaming)
        except InvalidInput as exc:
            raise request.renamed(exc) from None
        answer = Answer(
            endpoint,
            call.request_id,
            created,
            admitted.model,
            request.options.logprobs,
            request.options.include_usage,
        )
        with CancelOnDisconnect(exchange.receive, stream) as watch:
            try:
                if streaming:
                    await self._stream(exchange, admitted, stream, answer, watch)
                    return
                result = await stream.result()
            except RLServeError:
                if watch.gone:
                    raise Disconnected from None  # nobody is left to answer
                raise
        if answer.logprobs:
            answer.codec = self._codec(admitted, result.version)
        await exchange.json(200, answer.body(result), stamp(result.version, result.sha256))

    async def _stream(
        self,
        exchange: Exchange,
        admitted: Admitted,
        stream: GenerationStream,
        answer: Answer,
        watch: CancelOnDisconnect,
    ) -> None:
        events = await next_events(stream)  # raises the error that ends it before any token
        version = stream.model_version or 0
        if answer.logprobs:
            answer.codec = self._codec(admitted, version)
        await exchange.start(200, [*SSE_HEADERS, *stamp(version, stream.model_sha256)])
        try:
            while True:
                chunks = answer.chunks(version, events)
                if chunks:
                    await exchange.chunk(_data(chunks))
                events = await next_events(stream)
        except StopAsyncIteration:
            result = await stream.result()
            await exchange.chunk(_data(answer.end(result)) + _DONE, last=True)
        except RLServeError as exc:
            if watch.gone:
                raise Disconnected from None
            failure = error(exc)
            self.calls.http.refused(exchange.call, exc, failure.status)
            await exchange.chunk(_data([failure.body]) + _DONE, last=True)

    @staticmethod
    def _spec(exchange: Exchange, request: OpenAICall, admitted: Admitted) -> GenerationSpec:
        call = exchange.call
        return generation_spec(
            dict(request.generate), call.request_id, call.received_at, admitted.deadline.at
        )

    def _codec(self, admitted: Admitted, version: int) -> TextCodec:
        """The tokenizer of the version that generated (a request not pinned to a version
        runs on the one active when it joins the batch)."""
        if version == admitted.version.version:
            return admitted.version.codec
        try:
            route = self.calls.router.resolve(admitted.model, version)
            _, served = generation_parts(route, "generate")
        except RLServeError:  # gone already: versions of a model share their tokenizer
            return admitted.version.codec
        return served.codec


def _data(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)
