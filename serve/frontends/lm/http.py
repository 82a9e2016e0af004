"""The language-model frontend: generate and score over HTTP with JSON bodies.

    POST /v1/models/{model}/generate                     the model's active version
    POST /v1/models/{model}/score
    POST /v1/models/{model}/versions/{version}/generate  one version of a model
    POST /v1/models/{model}/versions/{version}/score

and every predict route (``/predict``, ``/v1/models/{model}/predict``, ...) of a language
model, which means generate (the process routes them here: :meth:`LanguageModelFrontend.
serves`).

generate takes ``prompt`` (text) or ``messages`` (a chat, rendered with the model's chat
template), and ``max_new_tokens``, ``temperature`` (0: greedy), ``top_p``, ``top_k``,
``seed``, ``stop`` (a string or a list), ``top_logprobs`` (the likeliest alternatives of
each new token, up to 20), ``echo`` (the prompt's own tokens scored too) and ``n`` (that
many generations of the prompt, a group: prefilled once, each reproducible from the seed
and its index; answered as ``choices``, the prompt counted once); it answers
``text``, ``token_ids``, ``log_probs`` (the model's, temperature 1), ``finish_reason``
(``stop`` or ``length``), token counts, and when asked ``top_log_probs`` (per token: its
position's likeliest ``token_id``, ``text`` and ``log_prob``) and ``prompt`` (its
``token_ids``, ``log_probs`` with ``null`` first, and ``top_log_probs``). With
``"stream": true`` the answer is server-sent events: ``event: token`` per token (``index``,
``token_id``, ``text``, ``log_prob``, ``top_log_probs`` when asked), then one ``event:
result`` with the whole answer, or ``event: error`` when the generation fails after it
started.

score takes ``prompt`` or ``messages``, ``completions`` (a list of texts) and
``top_logprobs`` and answers, per completion, its ``token_ids``, the ``log_probs`` of each,
their sum ``log_prob``, and ``top_log_probs`` (each position's likeliest) when asked.
Full-vocabulary logits never leave the server.

As on the predict routes: deadlines from ``X-Request-Timeout-Ms`` or the model's default
(504 past it), 429 with Retry-After when the model's queue is full, 503 while starting or
stopping, answers stamped with the version that computed them (body, X-Policy-Version,
X-Policy-SHA256), errors as ``{"error": {"code", "message"}}``. A streamed answer is stamped
once its first token exists: until then an error is still an ordinary error answer. Those
steps are shared with the OpenAI-compatible routes (``serve.frontends.lm.calls``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from kernel.errors import InvalidInput, RLServeError
from kernel.json_shown import json_shown
from kernel.lm.sampling import Alternatives
from kernel.versions import path_version
from serve.dataplane.kinds import ModelKind
from serve.frontends.http_calls import Disconnected, Exchange, allow, plain_error, stamp
from serve.frontends.lm.calls import (
    SSE_HEADERS,
    Admitted,
    CancelOnDisconnect,
    LanguageModelCalls,
    answer_tokens,
    bound_answer,
    json_answer,
    next_events,
)
from serve.frontends.lm.merged_streams import merged
from serve.lm.messages import (
    GenerationResult,
    GenerationSpec,
    ScoreResult,
    TokenEvent,
)
from serve.lm.requests import generation_specs, score_spec
from serve.lm.scheduling.generation_stream import GenerationStream
from serve.lm.text import TextCodec
from serve.status import http_status


class Action(StrEnum):
    GENERATE = "generate"
    SCORE = "score"


_ACTIONS = frozenset(a.value for a in Action)


@dataclass(frozen=True, slots=True)
class GeneratePath:
    """A language-model route's path parameters."""

    model: str | None  # None: the default model (POST /predict)
    version: str | None
    action: Action


PREFIXES = ("/v1/models/",)  # every path match() takes starts with it


def match(path: str) -> GeneratePath | None:
    """The generate or score route a path names, or None for any other path."""
    if not path.startswith("/v1/models/"):
        return None
    parts = path[len("/v1/models/") :].split("/")
    actions = _ACTIONS
    if len(parts) == 2 and parts[0] and parts[1] in actions:
        return GeneratePath(parts[0], None, Action(parts[1]))
    versioned = len(parts) == 4 and parts[0] and parts[1] == "versions" and parts[2]
    if versioned and parts[3] in actions:
        return GeneratePath(parts[0], parts[2], Action(parts[3]))
    return None


class LanguageModelFrontend:
    def __init__(
        self, calls: LanguageModelCalls, kind_of: Callable[[str | None], ModelKind | None]
    ) -> None:
        self.calls = calls
        self.kind_of = kind_of  # a model's kind by name (None: the default model)

    def serves(self, model: str | None) -> bool:
        """Whether a predict route's model is a language model (then it means generate)."""
        return self.kind_of(model) is ModelKind.GENERATIONS

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, path: GeneratePath
    ) -> None:
        async def handle(exchange: Exchange) -> None:
            allow(scope, "POST")
            if path.action is Action.SCORE:
                await self._score(exchange, path)
            else:
                await self._generate(exchange, path)

        await self.calls.http.serve(scope, receive, send, handle, plain_error)

    # ------------------------------------------------------------------ generate

    async def _generate(self, exchange: Exchange, path: GeneratePath) -> None:
        call = exchange.call
        admitted, payload = await self._read(exchange, path)
        streaming = payload.pop("stream", False)
        if not isinstance(streaming, bool):
            raise InvalidInput(f"stream: expected true or false, got {json_shown(streaming)}")
        specs = generation_specs(payload, call.request_id, call.received_at, admitted.deadline.at)
        if len(specs) > 1:
            await self._generate_group(exchange, admitted, specs, streaming=streaming)
            return
        generation = await self.calls.prepare(
            exchange, admitted.version.prepare_generation, specs[0]
        )
        (stream,) = self.calls.queue(admitted, [generation], tokens=streaming)
        with CancelOnDisconnect(exchange.receive, stream) as watch:
            try:
                if streaming:
                    await self._stream(exchange, admitted, stream, watch)
                    return
                result = await stream.result()
            except RLServeError:
                if watch.gone:
                    raise Disconnected from None  # nobody is left to answer
                raise
        codec = self.calls.codec(admitted, result.version)
        await json_answer(
            exchange,
            generation.answer_tokens,
            lambda: _generated(result, codec),
            stamp(result.version, result.sha256),
        )

    async def _stream(
        self,
        exchange: Exchange,
        admitted: Admitted,
        stream: GenerationStream,
        watch: CancelOnDisconnect,
    ) -> None:
        """Server-sent events: the head once the first token exists (errors before it are
        ordinary answers), then every token as it comes, then the result."""
        events = await next_events(stream)  # raises the error that ends it before any token
        version = stream.model_version or 0
        headers = [*SSE_HEADERS, *stamp(version, stream.model_sha256)]
        await exchange.start(200, headers)
        codec = self.calls.codec(admitted, version)
        try:
            while True:
                await exchange.chunk(b"".join(_token_event(e, codec) for e in events))
                events = await next_events(stream)
        except StopAsyncIteration:
            result = await stream.result()
            await exchange.chunk(_event(b"result", _generated(result, codec)), last=True)
        except RLServeError as exc:
            if watch.gone:
                raise Disconnected from None
            self.calls.http.refused(exchange.call, exc, http_status(exc))
            await exchange.chunk(_event(b"error", exc.to_json()), last=True)

    async def _generate_group(
        self,
        exchange: Exchange,
        admitted: Admitted,
        specs: list[GenerationSpec],
        *,
        streaming: bool,
    ) -> None:
        """``n`` generations of one prompt, queued together (its prefill shared): one answer
        with every choice, or their token events tagged with ``choice`` as they come."""
        bound = admitted.scheduler.max_queue_rows
        if len(specs) > bound:
            raise InvalidInput(
                f"n: {len(specs)} generations asked; model {admitted.model!r} queues at most "
                f"{bound} requests (its max_queue_rows setting), and each is one: ask for fewer"
            )
        self.calls.admit(admitted, "reading the body", len(specs))
        prepare = admitted.version.prepare_generations  # the prompt tokenized once
        generations = await self.calls.prepare(exchange, prepare, specs)
        streams = self.calls.queue(admitted, generations, tokens=streaming)
        with CancelOnDisconnect(exchange.receive, *streams) as watch:
            try:
                if streaming:
                    await self._stream_group(exchange, admitted, streams, watch)
                    return
                results = [await stream.result() for stream in streams]
            except RLServeError:
                for stream in streams:
                    stream.cancel()
                if watch.gone:
                    raise Disconnected from None
                raise
        first = results[0]
        codec = self.calls.codec(admitted, first.version)
        await json_answer(
            exchange,
            answer_tokens(generations),
            lambda: _group(results, codec),
            stamp(first.version, first.sha256),
        )

    async def _stream_group(
        self,
        exchange: Exchange,
        admitted: Admitted,
        streams: list[GenerationStream],
        watch: CancelOnDisconnect,
    ) -> None:
        """Each choice's token events as they come (with its ``choice`` index), then one
        result event with every choice."""
        results: list[GenerationResult | None] = [None] * len(streams)
        async with aclosing(merged(streams)) as turns:
            turn = await anext(turns)  # the error that ends a stream before any token
            first = streams[(turn.tokens or turn.finished)[0].index]
            version = first.model_version or 0
            await exchange.start(200, [*SSE_HEADERS, *stamp(version, first.model_sha256)])
            codec = self.calls.codec(admitted, version)
            try:
                while True:
                    events = [
                        _token_event(e, codec, tokens.index)
                        for tokens in turn.tokens
                        for e in tokens.events
                    ]
                    if events:  # every choice's tokens of the turn: one write
                        await exchange.chunk(b"".join(events))
                    for ended in turn.finished:
                        results[ended.index] = ended.result
                    turn = await anext(turns)
            except StopAsyncIteration:
                done = [result for result in results if result is not None]
                await exchange.chunk(_event(b"result", _group(done, codec)), last=True)
            except RLServeError as exc:
                for stream in streams:
                    stream.cancel()
                if watch.gone:
                    raise Disconnected from None
                self.calls.http.refused(exchange.call, exc, http_status(exc))
                await exchange.chunk(_event(b"error", exc.to_json()), last=True)

    # ------------------------------------------------------------------ score

    async def _score(self, exchange: Exchange, path: GeneratePath) -> None:
        call = exchange.call
        admitted, payload = await self._read(exchange, path)
        spec = score_spec(payload, call.request_id, call.received_at, admitted.deadline.at)
        scoring = await self.calls.prepare(exchange, admitted.version.prepare_scoring, spec)
        completions = scoring.completion_ids
        bound_answer(
            admitted,
            scoring.answer_tokens,
            lambda: (
                f"{len(completions)} completion(s) of {sum(map(len, completions))} tokens "
                f"in all times 1 + {spec.top_logprobs} top_logprobs"
            ),
        )
        admitted.deadline.check("validating it")
        result = await admitted.scheduler.submit_scoring(scoring, admitted.pinned)
        codec = self.calls.codec(admitted, result.version)
        await json_answer(
            exchange,
            scoring.answer_tokens,
            lambda: _scored(result, codec),
            stamp(result.version, result.sha256),
        )

    # ------------------------------------------------------------------ common

    async def _read(
        self, exchange: Exchange, path: GeneratePath
    ) -> tuple[Admitted, dict[str, Any]]:
        """Route the call, read its body within the limits, admit it: where it goes, and
        its body."""
        version = None if path.version is None else path_version(path.version)
        admitted = self.calls.route(exchange.call, path.model, version, path.action.value)
        body = await self.calls.read(exchange)
        self.calls.admit(admitted, "reading the body")  # overloaded: refuse before decoding
        return admitted, await self.calls.decode(exchange, body)


def _generated(result: GenerationResult, codec: TextCodec) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "model": result.model,
        "model_version": result.version,
        "model_sha256": result.sha256,
        "text": result.text,
        "token_ids": result.token_ids,
        "log_probs": result.log_probs,
        "finish_reason": result.finish_reason.value,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.token_ids),
    }
    if result.top:
        answer["top_log_probs"] = [_alternatives(top, codec) for top in result.top]
    if result.prompt is not None:
        prompt = result.prompt
        scored: dict[str, Any] = {
            "token_ids": prompt.token_ids,
            "log_probs": [None, *prompt.log_probs],
        }
        if prompt.top:
            scored["top_log_probs"] = [None, *(_alternatives(top, codec) for top in prompt.top)]
        answer["prompt"] = scored
    return answer


_STAMP_AND_PROMPT = ("model", "model_version", "model_sha256", "prompt_tokens", "prompt")


def _group(results: list[GenerationResult], codec: TextCodec) -> dict[str, Any]:
    """``n`` generations of one prompt: the stamp, the prompt (counted and, when echoed,
    scored) once, and each choice with its index."""
    first = _generated(results[0], codec)
    answer = {k: first[k] for k in _STAMP_AND_PROMPT if k in first}
    answer["choices"] = [
        {
            "index": index,
            **{k: v for k, v in _generated(result, codec).items() if k not in _STAMP_AND_PROMPT},
        }
        for index, result in enumerate(results)
    ]
    return answer


def _alternatives(top: Alternatives, codec: TextCodec) -> list[dict[str, Any]]:
    """A position's likeliest tokens, likeliest first: id, text (alone), log-prob."""
    return [
        {"token_id": token, "text": codec.token_text(token), "log_prob": log_prob}
        for token, log_prob in top
    ]


def _scored(result: ScoreResult, codec: TextCodec) -> dict[str, Any]:
    scores = []
    for score in result.scores:
        scored: dict[str, Any] = {
            "token_ids": score.token_ids,
            "log_probs": score.log_probs,
            "log_prob": score.total,
        }
        if score.top:
            scored["top_log_probs"] = [_alternatives(top, codec) for top in score.top]
        scores.append(scored)
    return {
        "model": result.model,
        "model_version": result.version,
        "model_sha256": result.sha256,
        "prompt_tokens": result.prompt_tokens,
        "scores": scores,
    }


def _token_event(event: TokenEvent, codec: TextCodec, choice: int | None = None) -> bytes:
    content: dict[str, Any] = {} if choice is None else {"choice": choice}
    content |= {
        "index": event.index,
        "token_id": event.token_id,
        "text": event.text,
        "log_prob": event.log_prob,
    }
    if event.top:
        content["top_log_probs"] = _alternatives(event.top, codec)
    return _event(b"token", content)


def _event(name: bytes, content: Any) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(content) + b"\n\n"
