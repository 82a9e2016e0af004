"""The predict frontend: HTTP with JSON bodies, as a lean ASGI application.

    POST /predict                                     the default model, its active version
    POST /v1/models/{model}/predict                   a model's active version
    POST /v1/models/{model}/versions/{version}/predict  one version of a model

A call is decoded into a protocol-neutral :class:`~serve.dataplane.messages.InferenceRequest`,
validated by the version it is routed to, submitted to the model's scheduler, and its
:class:`~serve.dataplane.messages.InferenceResponse` encoded as JSON, stamped with the
version that computed it (body, X-Policy-Version, X-Policy-SHA256). Errors are
``{"error": {"code", "message"}}`` with the status ``serve.status`` maps their code to.

A model with a result cache (``serve.stores.result_cache``) has its repeated
deterministic requests answered from Redis between validation and submission, with the
bytes the model's answer was encoded to; ``X-Result-Cache`` says hit, miss or bypass.

Nothing stands in front of this path but uvicorn: no framework routing, no dependency
solving, no middleware stack. The request id, the access-log line and ``Connection:
close`` while draining are added here directly; ``serve.process.openapi`` documents the
routes for /docs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from kernel.errors import (
    DeadlineExceeded,
    ErrorCode,
    InvalidInput,
    QueueFull,
    RLServeError,
)
from kernel.versions import path_version
from serve.dataplane.deadline import Deadline, budget_ms
from serve.dataplane.messages import InferenceRequest, InferenceResponse, Prepared
from serve.dataplane.routing import Route, Router
from serve.dataplane.row_calls import INLINE_BODY_BYTES, PreparedOn, RowCalls
from serve.dataplane.scheduler import Scheduler
from serve.frontends.http_calls import (
    JSON_HEADER,
    READ_AGAIN_AFTER_S,
    Call,
    ErrorAnswer,
    Exchange,
    Headers,
    HttpCalls,
    Responder,
    allow,
    error_headers,
    plain_error,
    read_body,
    stamp,
    start_call,
    unexpected,
)
from serve.frontends.predict.json_body import PredictBodyDecoder
from serve.frontends.wire import JSON_OPTIONS, episode_key, timeout_header_ms
from serve.stores import features
from serve.stores.features import FeatureLookup
from serve.stores.result_cache import CacheSettings, ResultCache, cache_key

log = logging.getLogger("rlserve.predict")

INPUTS = ("observations", "actions", "action_masks", "state", "episode_start")
REFUSING_S = 0.1  # after a 429 or 504, calls are checked from their headers for this long
# What says the process is overloaded: a call refused, or one whose deadline passed.
_OVERLOADED = frozenset((ErrorCode.QUEUE_FULL, ErrorCode.DEADLINE_EXCEEDED))
EARLY_ANSWER_S = 0.01  # a model's early 429 (its message, Retry-After) is this fresh
_QUEUE_FULL = ErrorCode.QUEUE_FULL.value
PARAMETERS = (
    "deterministic",
    "seed",
    "outputs",
    "sequence_id",  # a recurrent policy's server-held sequences (serve.batching.sequences)
    "sequence_start",
    "sequence_end",
    "sequence_owner",
)
FIELDS = (*INPUTS, *PARAMETERS)
_NO_PARAMETERS: dict[str, Any] = {}
_CACHE_HIT = (b"x-result-cache", b"hit")
_CACHE_MISS = (b"x-result-cache", b"miss")  # looked up (not found, or Redis failed): run
_CACHE_BYPASS = (b"x-result-cache", b"bypass")  # sampled or seeded, or the model is held


@dataclass(frozen=True, slots=True)
class PredictPath:
    """A predict route's path parameters: the model and version, when the path names them."""

    model: str | None
    version: str | None


PREFIXES = ("/predict", "/v1/models/")  # every path match() takes starts with one of these


def match(path: str) -> PredictPath | None:
    """The predict route a path names, or None for any other path."""
    if path == "/predict":
        return PredictPath(None, None)
    if not (path.startswith("/v1/models/") and path.endswith("/predict")):
        return None
    parts = path[len("/v1/models/") : -len("/predict")].split("/")
    if len(parts) == 1 and parts[0]:
        return PredictPath(parts[0], None)
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return PredictPath(parts[0], parts[2])
    return None


class PredictFrontend:
    def __init__(
        self,
        router: Router,
        calls: HttpCalls,
        max_body_bytes: int,
        *,
        rows: RowCalls,
        features: FeatureLookup,
    ) -> None:
        self.router = router
        self.calls = calls  # the call around the predict steps: errors, metrics, access log
        self.metrics = calls.metrics
        self.max_body_bytes = max_body_bytes
        self.bodies = _decoder()  # the event loop's
        self.results = ResultCache(calls.metrics)  # models with a result_cache
        self.features = features  # models with a features view: their stores
        self.rows = rows  # the steps of a row call, every frontend's (and the loop's turn)
        self._early: dict[str, _EarlyAnswer] = {}  # by model: its current early 429
        self._gates: dict[bytes, _Gate] = {}  # by predict path: what refuse_early needs
        self._refusing_until = 0.0  # calls are checked from their headers until then

    async def __call__(self, scope: Scope, receive: Receive, send: Send, path: PredictPath) -> None:
        await self.calls.serve(scope, receive, send, partial(self._handle, path=path), self._render)

    async def _handle(self, exchange: Exchange, *, path: PredictPath) -> None:
        scope = exchange.scope
        allow(scope, "POST")
        body, headers = await self._predict(exchange.call, exchange.receive, path)
        await exchange.answer(200, body, [*headers, JSON_HEADER])

    def answer_now(
        self, scope: Scope, body: bytes, responder: Responder, path: PredictPath
    ) -> bool:
        """The call answered without a task (``RouteEntry.now``): the same steps as
        ``_predict``'s, where none of them waits (a small body; no result cache, features
        view), with the answer written when the batch is done.
        False (nothing done) for any other call: ``__call__`` answers it."""
        if scope["method"] != "POST" or len(body) > min(INLINE_BODY_BYTES, self.max_body_bytes):
            return False
        call = start_call(scope)
        try:
            route, deadline = self._routed(call, path)
            if route.result_cache is not None or route.features is not None:
                return False
            self.rows.admit(route, deadline, spent_on="reading the body")
            prepared, _ = _prepare(route, body, call, deadline.at, self.bodies, None)
            future = self.rows.queue(route, prepared, deadline)
        except RLServeError as exc:
            self.calls.refuse_now(responder, scope, call, exc, self._render)
        except Exception as exc:
            self.calls.refuse_now(responder, scope, call, unexpected(scope, exc), self._render)
        else:
            future.add_done_callback(partial(self._answered, scope, call, responder))
        return True

    def _answered(
        self,
        scope: Scope,
        call: Call,
        responder: Responder,
        future: asyncio.Future[InferenceResponse],
    ) -> None:
        """A call answered without a task: its batch is done."""

        def answer() -> tuple[int, Headers, bytes]:
            response = future.result()
            headers = [*stamp(response.version, response.sha256), JSON_HEADER]
            return 200, headers, _encode(response)

        self.calls.settle_now(responder, scope, call, answer, self._render)

    def _render(self, error: RLServeError) -> ErrorAnswer:
        if error.code in _OVERLOADED:  # refuse the next calls from their headers
            self._refusing_until = time.monotonic() + REFUSING_S
        return plain_error(error)

    async def _predict(
        self, call: Call, receive: Receive, path: PredictPath
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The answer's body and headers."""
        route, deadline = self._routed(call, path)
        body = await read_body(receive, call.declared_length, self.max_body_bytes)
        self.rows.admit(route, deadline, spent_on="reading the body")  # before decoding
        cache = None if route.scheduler.held else route.result_cache  # held: answers wait

        def prepare(where: PreparedOn) -> tuple[Prepared, bytes | None]:
            # a worker thread decodes with a parser of its own (simdjson's are not shared)
            bodies = self.bodies if where is PreparedOn.LOOP else _decoder()
            return _prepare(route, body, call, deadline.at, bodies, cache)

        audit: dict[str, Any] | None = None  # the feature values used, when asked
        if route.features is None:
            prepared, key = await self.rows.prepare(len(body), prepare)
        else:
            route, prepared, key, audit = await self._by_entity(route, body, call, deadline, cache)
        if key is not None and cache is not None:
            cached = await self.results.lookup(route.model, cache, key)
            if cached is not None:
                seconds = time.monotonic() - call.received_at
                self.metrics.answered_from_cache(
                    route.model, route.version.version, seconds, prepared.out_of_bounds
                )
                # computed earlier by the routed version
                return cached, [*stamp(route.version.version, route.version.sha256), _CACHE_HIT]
        response = await self.rows.submit(route, prepared, deadline)
        answer, headers = _encode(response, audit), stamp(response.version, response.sha256)
        if key is not None and cache is not None:
            if (response.version, response.sha256) == (route.version.version, route.version.sha256):
                self.results.store(route.model, cache, key, answer)  # not awaited
            headers.append(_CACHE_MISS)
        elif route.result_cache is not None:
            headers.append(_CACHE_BYPASS)
        return answer, headers

    def _routed(self, call: Call, path: PredictPath) -> tuple[Route, Deadline]:
        """The route a call's path names (the call's metrics labels now name it) and the
        call's deadline."""
        version = None if path.version is None else path_version(path.version)
        route = self.router.resolve(path.model, version, episode_key(call.episode_header))
        call.model, call.version = route.model, route.version.version
        budget = budget_ms(route.default_deadline_ms, timeout_header_ms(call.timeout_header))
        return route, self.rows.turn.deadline(call.received_at, budget)

    async def _by_entity(
        self, route: Route, body: bytes, call: Call, deadline: Deadline, cache: CacheSettings | None
    ) -> tuple[Route, Prepared, bytes | None, dict[str, Any] | None]:
        """A model with a features view: a body naming ``entities`` gets its observations
        from the store (``serve.stores.features``) before it is validated; with
        ``features``, the request's own values of overridable features; with
        ``return_features``, the answer names the feature values used (last: them). First:
        the route to submit to (``Route.by_entity``: a version's own view pins it)."""
        view = route.features
        assert view is not None

        def decode(where: PreparedOn) -> dict[str, Any]:
            return (self.bodies if where is PreparedOn.LOOP else _decoder()).decode(body)

        payload = await self.rows.prepare(len(body), decode)
        entities = payload.pop(features.FIELD, None)
        overrides = payload.pop(features.OVERRIDES, None)
        asked = payload.pop(features.RETURN, False)
        if not isinstance(asked, bool):
            raise InvalidInput(f"{features.RETURN}: expected true or false")
        audit = None
        if entities is None:
            if overrides is not None or asked:
                raise InvalidInput(
                    f"{features.OVERRIDES}, {features.RETURN}: only with {features.FIELD} "
                    "(the features of entities from the store)"
                )
        else:
            if "observations" in payload:
                raise InvalidInput(
                    f"observations, {features.FIELD}: give one: the observations themselves, "
                    f"or the entities whose features model {route.model!r} reads from its store"
                )
            rows, single = await self.features.observations(
                route.model, view, entities, deadline, overrides
            )
            route = route.by_entity()
            payload["observations"] = features.observations(view, rows, single=single)
            if asked:
                audit = features.used(view, rows, single=single)
                cache = None  # an answer with its features is the request's own
        prepared = route.row_model().prepare(_request(payload, call, deadline.at))
        if cache is None:
            return route, prepared, None, audit
        version = route.version
        key = cache_key(route.model, version.version, version.sha256, prepared)
        return route, prepared, key, audit

    def refuse_early(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        received_at: float,
    ) -> EarlyRefusal | None:
        """The refusal (429, or 504 once its deadline passed) of a predict call its model
        would refuse now, decided from the request line and headers alone; None to serve the
        call as usual. ``received_at`` is when the call's bytes arrived (``Arrival``).
        The HTTP protocol (``serve.process.protocol``) asks before it starts a call, so an
        overloaded server refuses for the cost of parsing headers, not of a whole call, and
        reads the connection again only ``READ_AGAIN_AFTER_S`` later: a client that ignores
        Retry-After cannot keep the process busy refusing it."""
        if method != b"POST" or time.monotonic() > self._refusing_until or self.calls.draining():
            return None  # nothing was refused lately: calls go their usual way
        raw_path = target.partition(b"?")[0]
        gate = self._gates.get(raw_path)  # the common case, in a few dictionary lookups
        if gate is None:
            gate = self._gate_for(raw_path)
            if gate is None:
                return None
        timeout = next((v for k, v in headers if k == b"x-request-timeout-ms"), None)
        try:
            asked = timeout_header_ms(None if timeout is None else timeout.decode())
        except RLServeError:
            return None  # the call itself will say what is wrong
        deadline = self.rows.turn.deadline(received_at, budget_ms(gate.default_ms, asked))
        late = deadline.at <= time.monotonic()
        # its handler runs about a turn of the loop from now: admissible then?
        due = deadline.at - self.rows.turn.seconds
        if not late and gate.scheduler.would_admit(1, due):
            return None
        call = start_call({"headers": headers})
        call.received_at = received_at
        try:
            route = self.router.resolve(gate.path.model, None)
        except RLServeError:
            return None
        call.model, call.version = route.model, route.version.version
        if late:
            too_late = self._late_answer(call, deadline.budget_ms, gate.path)
            return EarlyRefusal(too_late, READ_AGAIN_AFTER_S)
        refused = self._early_answer(call, route, due, gate.path)
        return None if refused is None else EarlyRefusal(refused, READ_AGAIN_AFTER_S)

    def _late_answer(self, call: Call, budget: float, path: PredictPath) -> bytes:
        """The 504 of a call whose deadline passed before it was read: it waited unread
        after a refusal, or the loop is so overloaded that its wait ate the budget."""
        error = DeadlineExceeded(
            f"the request's deadline of {budget:g} ms passed before it was read (after a "
            "429, a connection is read again once its Retry-After has passed); it was not run"
        )
        answer = plain_error(error)
        self.calls.refused(call, error, answer.status)
        self._logged_early(call, path, answer.status)
        head = _error_head(b"HTTP/1.1 504 Gateway Timeout\r\n", error)
        return _whole(head, orjson.dumps(answer.body), call.request_id)

    def _gate_for(self, raw_path: bytes) -> _Gate | None:
        """A predict path's model scheduler, remembered for the next calls; only paths
        naming no version (a version's own checks belong to the call) of models that exist."""
        path = None if b"%" in raw_path else match(raw_path.decode("latin-1"))
        if path is None or path.version is not None:
            return None
        try:
            route = self.router.resolve(path.model, None)
        except RLServeError:
            return None
        gate = self._gates[raw_path] = _Gate(path, route.scheduler, route.default_deadline_ms)
        return gate

    def _early_answer(
        self, call: Call, route: Route, deadline: float, path: PredictPath
    ) -> bytes | None:
        """The 429 for a call refused from its headers. Its head and body are built once
        per model every EARLY_ANSWER_S (under overload thousands of calls a second get the
        same answer); only the request id is the call's own."""
        now = time.monotonic()
        cached = self._early.get(route.model)
        if cached is None or cached.until <= now:
            try:
                route.scheduler.admit(1, deadline)
            except QueueFull as exc:
                answer = self._render(exc)
                self.calls.refused(call, exc, answer.status)
                head = _error_head(b"HTTP/1.1 429 Too Many Requests\r\n", exc)
                cached = _EarlyAnswer(now + EARLY_ANSWER_S, head, orjson.dumps(answer.body))
                self._early[route.model] = cached
            else:
                return None  # admitted after all: serve it
        else:
            seconds = now - call.received_at
            self.metrics.refused(call.model, call.version, 429, _QUEUE_FULL, seconds)
        self._logged_early(call, path, 429)
        return cached.encode(call.request_id)

    def _logged_early(self, call: Call, path: PredictPath, status: int) -> None:
        """The access-log line of a call answered from its headers (it has no ASGI scope:
        one is made for the line, when the log is on)."""
        if self.calls.access_log is not None:
            scope: Scope = {"method": "POST", "path": _path_of(path), "client": None}
            self.calls.logged(scope, call, status)


def _path_of(path: PredictPath) -> str:
    if path.model is None:
        return "/predict"
    version = "" if path.version is None else f"/versions/{path.version}"
    return f"/v1/models/{path.model}{version}/predict"


@dataclass(frozen=True, slots=True)
class EarlyRefusal:
    """A call refused from its headers: its whole HTTP answer, and how long its connection
    is left unread after it."""

    answer: bytes
    read_again_after_s: float


@dataclass(frozen=True, slots=True)
class _Gate:
    """What deciding on a call from its headers needs of its path."""

    path: PredictPath
    scheduler: Scheduler
    default_ms: float


@dataclass(frozen=True, slots=True)
class _EarlyAnswer:
    until: float  # monotonic seconds: built again after that
    head: bytes  # status line and headers, but the request id
    body: bytes

    def encode(self, request_id: str) -> bytes:
        return _whole(self.head, self.body, request_id)


def _error_head(status_line: bytes, error: RLServeError) -> bytes:
    """An answer's status line and headers for ``error``, but its length and request id."""
    return status_line + b"".join(
        k + b": " + v + b"\r\n" for k, v in [*error_headers(error), JSON_HEADER]
    )


def _whole(head: bytes, body: bytes, request_id: str) -> bytes:
    """A whole HTTP answer written from headers: ``head``, its length, its request id, body."""
    return (
        head
        + b"content-length: %d\r\nx-request-id: %s\r\n\r\n"
        % (len(body), request_id.encode("latin-1"))
        + body
    )


def _decoder() -> PredictBodyDecoder:
    return PredictBodyDecoder(frozenset(PARAMETERS))


def _prepare(
    route: Route,
    body: bytes,
    call: Call,
    deadline: float,
    bodies: PredictBodyDecoder,
    cache: CacheSettings | None,
) -> tuple[Prepared, bytes | None]:
    """Decode and validate a body (only the prepared arrays outlive this call), and name
    its answer in the result cache when the model has one and the answer may come from it."""
    payload = bodies.decode(body)
    prepared = route.row_model().prepare(_request(payload, call, deadline))
    if cache is None:
        return prepared, None
    version = route.version
    return prepared, cache_key(route.model, version.version, version.sha256, prepared)


def _request(payload: dict[str, Any], call: Call, deadline: float) -> InferenceRequest:
    """The decoded JSON predict body as a protocol-neutral request."""
    if len(payload) == 1 and "observations" in payload:  # the common case, nothing to split
        return InferenceRequest(
            payload, _NO_PARAMETERS, call.request_id, call.received_at, deadline
        )
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        if features.FIELD in unknown:
            raise InvalidInput(
                f"{features.FIELD}: this model has no features view (its config's "
                "features), so it reads no store; send observations"
            )
        raise InvalidInput(f"unknown field(s) {unknown}; a request may have {list(FIELDS)}")
    return InferenceRequest(
        {k: payload[k] for k in INPUTS if k in payload},
        {k: payload[k] for k in PARAMETERS if k in payload},
        call.request_id,
        call.received_at,
        deadline,
    )


def _encode(response: InferenceResponse, audit: dict[str, Any] | None = None) -> bytes:
    outputs = response.outputs
    if response.single:
        outputs = _unbatch(outputs)
    stamped = {
        "model": response.model,
        "model_version": response.version,
        "model_sha256": response.sha256,
        **outputs,
    }
    if audit is not None:
        stamped[features.OVERRIDES] = audit  # the feature values the answer was computed from
    return orjson.dumps(stamped, option=JSON_OPTIONS)


def _unbatch(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: (_unbatch(v) if isinstance(v, dict) else v[0]) for k, v in answer.items()}
