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
``seed``, ``stop`` (a string or a list); it answers ``text``, ``token_ids``, ``log_probs``
(the model's, temperature 1), ``finish_reason`` (``stop`` or ``length``) and token counts.
With ``"stream": true`` the answer is server-sent events: ``event: token`` per token
(``index``, ``token_id``, ``text``, ``log_prob``), then one ``event: result`` with the
whole answer, or ``event: error`` when the generation fails after it started.

score takes ``prompt`` or ``messages`` and ``completions`` (a list of texts) and answers,
per completion, its ``token_ids``, the ``log_probs`` of each and their sum ``log_prob``.
Full-vocabulary logits never leave the server.

As on the predict routes: deadlines from ``X-Request-Timeout-Ms`` or the model's default
(504 past it), 429 with Retry-After when the model's queue is full, 503 while starting or
stopping, answers stamped with the version that computed them (body, X-Policy-Version,
X-Policy-SHA256), errors as ``{"error": {"code", "message"}}``. A streamed answer is stamped
once its first token exists: until then an error is still an ordinary error answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from serve.access import log_exchange
from serve.dataplane.continuous_batcher import ContinuousBatchScheduler
from serve.dataplane.exchange import (
    INLINE_BODY_BYTES,
    Call,
    Disconnected,
    deadline_at,
    read_body,
    start_call,
)
from serve.dataplane.generation_stream import GenerationStream
from serve.dataplane.routing import Router
from serve.dataplane.scheduler import Scheduler
from serve.dataplane.wire import deadline_ms, decode_object
from serve.errors import (
    DeadlineExceeded,
    InvalidInput,
    MethodNotAllowed,
    NotFound,
    RLServeError,
)
from serve.lm.messages import GenerationResult, ScoreResult, TokenEvent
from serve.lm.model import LanguageModel
from serve.lm.requests import generation_spec, score_spec
from serve.metrics import Metrics
from serve.status import http_headers, http_status
from serve.versions import path_version

log = logging.getLogger("rlserve.generate")

_JSON_HEADER = (b"content-type", b"application/json")
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_CLOSE_HEADER = (b"connection", b"close")


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
        self,
        router: Router,
        schedulers: Callable[[str | None], Scheduler | None],
        metrics: Metrics,
        max_body_bytes: int,
        draining: Callable[[], bool],
        *,
        access_log: bool,
    ) -> None:
        self.router = router
        self.schedulers = schedulers  # a model's scheduler by name (None: the default model)
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.draining = draining
        self.access_log = access_log
        self.turn_s = 0.0  # a turn of the event loop, as the process measures it
        self._kinds: dict[str | None, bool] = {}  # by model name: a language model?

    def serves(self, model: str | None) -> bool:
        """Whether a predict route's model is a language model (then it means generate)."""
        known = self._kinds.get(model)
        if known is None:
            scheduler = self.schedulers(model)
            if scheduler is None:
                return False
            known = self._kinds[model] = isinstance(scheduler, ContinuousBatchScheduler)
        return known

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, path: GeneratePath
    ) -> None:
        call = start_call(scope)
        exchange = _Exchange(scope, receive, send, call, self.draining)
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(
                    f"{scope['method']} {scope['path']}: {path.action.value} accepts POST only"
                )
            if path.action is Action.SCORE:
                await self._score(exchange, path)
            else:
                await self._generate(exchange, path)
        except RLServeError as exc:
            await self._answer_error(exchange, exc)
        except Disconnected:
            return
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            error = RLServeError(f"internal error: {type(exc).__name__}; see the server log")
            await self._answer_error(exchange, error)
        if self.access_log:
            log_exchange(
                scope, call.request_id, exchange.status, time.monotonic() - call.received_at
            )

    # ------------------------------------------------------------------ generate

    async def _generate(self, exchange: _Exchange, path: GeneratePath) -> None:
        call = exchange.call
        scheduler, model, pinned, deadline, payload = await self._read(exchange, path)
        streaming = payload.pop("stream", False)
        if not isinstance(streaming, bool):
            raise InvalidInput(f"stream: expected true or false, got {streaming!r}")
        spec = generation_spec(payload, call.request_id, call.received_at, deadline)
        generation = await _off_loop_if_large(exchange, model.prepare_generation, spec)
        _check_deadline(deadline, "validating it")
        stream = scheduler.submit_generation(generation, pinned, tokens=streaming)
        with _CancelOnDisconnect(exchange.receive, stream) as watch:
            try:
                if streaming:
                    await self._stream(exchange, stream, watch)
                    return
                result = await stream.result()
            except RLServeError:
                if watch.gone:
                    raise Disconnected from None  # nobody is left to answer
                raise
        await exchange.json(200, _generated(result), _stamp(result.version, result.sha256))

    async def _stream(
        self, exchange: _Exchange, stream: GenerationStream, watch: _CancelOnDisconnect
    ) -> None:
        """Server-sent events: the head once the first token exists (errors before it are
        ordinary answers), then every token as it comes, then the result."""
        first = await anext(stream)  # raises the error that ends it before any token
        headers = [*_SSE_HEADERS, *_stamp(stream.model_version or 0, stream.model_sha256)]
        await exchange.start(200, headers)
        events = [first]
        try:
            while True:
                await exchange.chunk(b"".join(_token_event(e) for e in events))
                events = [await anext(stream)]
                events += stream.drain()
        except StopAsyncIteration:
            result = await stream.result()
            await exchange.chunk(_event(b"result", _generated(result)), last=True)
        except RLServeError as exc:
            if watch.gone:
                raise Disconnected from None
            self._count_refusal(exchange.call, exc)
            await exchange.chunk(_event(b"error", exc.to_json()), last=True)

    # ------------------------------------------------------------------ score

    async def _score(self, exchange: _Exchange, path: GeneratePath) -> None:
        call = exchange.call
        scheduler, model, pinned, deadline, payload = await self._read(exchange, path)
        spec = score_spec(payload, call.request_id, call.received_at, deadline)
        scoring = await _off_loop_if_large(exchange, model.prepare_scoring, spec)
        _check_deadline(deadline, "validating it")
        future = scheduler.submit_scoring(scoring, pinned)
        result = await future
        await exchange.json(200, _scored(result), _stamp(result.version, result.sha256))

    # ------------------------------------------------------------------ common

    async def _read(
        self, exchange: _Exchange, path: GeneratePath
    ) -> tuple[ContinuousBatchScheduler, LanguageModel, int | None, float, dict[str, Any]]:
        """Route the call, read its body within the limits, admit it: the scheduler, the
        version that prepares it, the version it is pinned to, its deadline, its body."""
        call = exchange.call
        version = None if path.version is None else path_version(path.version)
        route = self.router.resolve(path.model, version)
        call.model, call.version = route.model, route.version.version
        scheduler, model = route.scheduler, route.version
        if not isinstance(scheduler, ContinuousBatchScheduler) or not isinstance(
            model, LanguageModel
        ):
            raise NotFound(
                f"model {route.model!r} is not a language model: it has no {path.action.value} "
                f"route; POST /v1/models/{route.model}/predict with observations"
            )
        budget_ms = deadline_ms(call.timeout_header, route.default_deadline_ms)
        deadline = deadline_at(call.received_at, budget_ms, self.turn_s)
        body = await read_body(exchange.receive, call.declared_length, self.max_body_bytes)
        _check_deadline(deadline, "reading the body")
        scheduler.admit(1, deadline)  # overloaded: refuse before decoding
        exchange.large = len(body) > INLINE_BODY_BYTES
        if exchange.large:  # work in proportion to the body: off the event loop
            payload = await asyncio.to_thread(decode_object, body)
        else:
            payload = decode_object(body)
        return scheduler, model, route.pinned, deadline, payload

    async def _answer_error(self, exchange: _Exchange, error: RLServeError) -> None:
        if exchange.started:  # a stream already answered 200: nothing more to say
            return
        status = self._count_refusal(exchange.call, error)
        headers = [(k.lower().encode(), v.encode()) for k, v in http_headers(error).items()]
        await exchange.json(status, error.to_json(), headers)

    def _count_refusal(self, call: Call, error: RLServeError) -> int:
        status = http_status(error)
        seconds = time.monotonic() - call.received_at
        self.metrics.refused(call.model, call.version, status, error.code.value, seconds)
        return status


class _Exchange:
    """One call's answer as it is written: status, headers, body or event chunks."""

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, call: Call, draining: Callable[[], bool]
    ) -> None:
        self.scope, self.receive, self._send, self.call = scope, receive, send, call
        self._draining = draining
        self.status = 0
        self.started = False
        self.large = False  # its body is large: work in proportion to it goes off the loop

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.started = status, True
        headers = [*headers, (b"x-request-id", self.call.request_id.encode("latin-1"))]
        if self._draining():
            headers.append(_CLOSE_HEADER)
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def chunk(self, body: bytes, *, last: bool = False) -> None:
        message: Message = {"type": "http.response.body", "body": body, "more_body": not last}
        await self._send(message)

    async def json(self, status: int, content: Any, headers: list[tuple[bytes, bytes]]) -> None:
        body = orjson.dumps(content)
        length = (b"content-length", str(len(body)).encode())
        await self.start(status, [*headers, _JSON_HEADER, length])
        await self.chunk(body, last=True)


class _CancelOnDisconnect:
    """While the answer is being produced, watch for the client going away (its body is
    read, so the next message is the disconnect) and give up on the generation then."""

    def __init__(self, receive: Receive, stream: GenerationStream) -> None:
        self._receive, self._stream = receive, stream
        self._watch: asyncio.Task[Message] | None = None
        self.gone = False

    def __enter__(self) -> _CancelOnDisconnect:
        self._watch = asyncio.ensure_future(self._receive())
        self._watch.add_done_callback(self._gone)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()

    def _gone(self, watch: asyncio.Task[Message]) -> None:
        if watch.cancelled() or watch.exception() is not None:
            return
        if watch.result().get("type") == "http.disconnect":
            self.gone = True
            self._stream.cancel()


async def _off_loop_if_large(exchange: _Exchange, prepare: Callable[[Any], Any], spec: Any) -> Any:
    """Tokenize on the event loop, or on a worker thread for a large body."""
    if exchange.large:
        return await asyncio.to_thread(prepare, spec)
    return prepare(spec)


def _check_deadline(deadline: float, spent_on: str) -> None:
    if time.monotonic() >= deadline:
        raise DeadlineExceeded(f"the request's deadline passed while {spent_on}; it was not run")


def _stamp(version: int, sha256: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-policy-version", str(version).encode()), (b"x-policy-sha256", sha256.encode())]


def _generated(result: GenerationResult) -> dict[str, Any]:
    return {
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


def _scored(result: ScoreResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "model_version": result.version,
        "model_sha256": result.sha256,
        "prompt_tokens": result.prompt_tokens,
        "scores": [
            {"token_ids": s.token_ids, "log_probs": s.log_probs, "log_prob": s.total}
            for s in result.scores
        ],
    }


def _token_event(event: TokenEvent) -> bytes:
    content = {
        "index": event.index,
        "token_id": event.token_id,
        "text": event.text,
        "log_prob": event.log_prob,
    }
    return _event(b"token", content)


def _event(name: bytes, content: Any) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(content) + b"\n\n"
