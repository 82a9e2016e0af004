"""The ASGI application of one server process: ``create_app()`` builds it (gunicorn:
``serve.process.app:create_app()``).

Two planes share the process and its port:

- the **data plane**: one table of (match, answer) entries, no framework in front of them:
  the predict routes to ``serve.frontends.predict.http`` (or to the model's kind, when it
  answers them itself: a language model's predict means generate), the Open Inference
  Protocol's ``/v2`` routes to ``serve.frontends.oip.rest``, then each kind's own routes
  (``serve.plugins``: a language model's generate, score and OpenAI-compatible routes);
- the **control plane**: everything else — models, live updates, health, readiness,
  metrics, /docs — is a FastAPI application, wrapped once by the access middleware.
``GET /v1/models`` answers rlserve's listing (``models``) and what each kind adds to it
(OpenAI's ``object`` and ``data``: the language models), so OpenAI clients list models too.

The lifespan loads the models while the server already answers /health, and stops the
models' schedulers at shutdown (``serve.process.phases`` has the whole shutdown order).
Settings are read when the app is created, never at import. Errors of the control plane
become ``{"error": {"code": ..., "message": ...}}`` here; the data plane answers its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kernel.errors import MalformedRequest, MethodNotAllowed, NotFound, RLServeError, internal_error
from serve import __version__, config
from serve.batching.record import RecordSink
from serve.control import single_file
from serve.control.admin import AdminEndpoints
from serve.control.api import ModelEndpoints
from serve.control.canary_evidence import CanaryEvidence
from serve.control.episodes import EpisodeBook, EpisodeEndpoints
from serve.control.http_bodies import error_response, json_response
from serve.control.manager import ModelRepositoryManager
from serve.control.shadow_mirror import ShadowMirror
from serve.control.sync import RepositorySync
from serve.control.updates import Updater
from serve.control.watcher import RepositoryWatcher
from serve.control.workers import WorkerRegistry
from serve.dataplane.deadline import LoopTurn
from serve.dataplane.kinds import ModelKind
from serve.dataplane.row_calls import RowCalls
from serve.frontends.access import AccessLog, AccessMiddleware
from serve.frontends.http_calls import HttpCalls, Responder
from serve.frontends.lane.server import LaneLimits, LaneServer, LaneServing
from serve.frontends.oip import rest as oip_rest
from serve.frontends.oip import rpc as oip_rpc
from serve.frontends.oip.infer import Inference
from serve.frontends.oip.rpc import GrpcServer
from serve.frontends.oip.shared_memory import SharedMemory
from serve.frontends.predict import http as predict
from serve.metrics import Metrics
from serve.plugins import Answer, FrontendParts, RouteEntry, plugins, register_metrics
from serve.process import memory, openapi
from serve.process.operations import OperationsEndpoints
from serve.process.phases import ServerPhases
from serve.process.state import ServerState
from serve.stores.features import FeatureLookup

log = logging.getLogger("rlserve.app")

LOAD_SAMPLE_S = 0.1  # how often the queue and pending-rows gauges are set
TURN_SAMPLE_S = 0.01  # how often a turn of the event loop is measured
REPOSITORY_RETRY_S = 2.0  # how often a repository missing at start is looked for again


class RLServeApp:
    """Routes each call to its plane (the data plane's routes: the first entry of the
    table that matches), and runs the lifespan."""

    def __init__(
        self,
        state: ServerState,
        control: ASGIApp,
        routes: Sequence[RouteEntry],
        transports: Transports,
        turn: LoopTurn,
        access_log: AccessLog | None = None,
    ):
        self.state = state
        self.access_log = access_log  # flushed once more at shutdown
        self.turn = turn  # every frontend's deadlines read it
        self.control = control
        self.routes = routes  # the data plane's route table: the first entry that matches
        self.transports = transports
        self._background: list[asyncio.Task[None]] = []

    def route(self, path: str) -> tuple[RouteEntry, Any] | None:
        """The data-plane route ``path`` names: the first entry of the table that matches,
        and what it parsed; None for the control plane's paths."""
        for entry in self.routes:
            matched = entry.match(path) if path.startswith(entry.prefixes) else None
            if matched is not None:
                return entry, matched
        return None

    def answer_now(
        self, scope: Scope, body: bytes, responder: Responder, route: tuple[RouteEntry, Any]
    ) -> bool:
        """A data-plane call whose body has arrived, answered without a task where its
        route can (``RouteEntry.now``); False: the HTTP protocol starts its task."""
        entry, matched = route
        return entry.now is not None and entry.now(scope, body, responder, matched)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = self.route(scope["path"])
            if found is not None:
                entry, matched = found
                await entry.answer(scope, receive, send, matched)
                return
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.control(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        memory.tune()
        self._background = [
            asyncio.create_task(_load(self.state), name="rlserve-load"),
            asyncio.create_task(_sample_load(self.state.manager), name="rlserve-load-gauges"),
            asyncio.create_task(
                _measure_turns(self.turn),
                name="rlserve-loop-turns",
            ),
        ]
        if self.state.phases.listen_after_load:
            await self.state.phases.loaded.wait()  # uvicorn listens once startup completes
        grpc, lane = self.transports.grpc, self.transports.lane
        try:
            if grpc is not None:
                await grpc.start()
            if lane is not None:
                await lane.start()
        except RLServeError as exc:
            await send({"type": "lifespan.startup.failed", "message": exc.message})
            return
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        self.state.phases.begin_stop()
        for task in self._background:
            task.cancel()
        if grpc is not None:  # no new gRPC calls; those in flight finish
            await grpc.stop(self.state.settings.graceful_timeout_s)
        if lane is not None:  # no new lanes; calls in flight finish; lanes close
            await lane.stop(self.state.settings.graceful_timeout_s)
        await self.state.manager.stop()
        predict_frontend = self.transports.predict
        await predict_frontend.results.close()  # the result cache's writes in flight finish
        predict_frontend.features.close()  # the feature stores' links
        self.transports.v2.inference.shared_memory.close()  # unmapped; clients' objects stay
        self.state.manager.sample_load()
        await asyncio.to_thread(self.state.updater.registry.withdraw)
        if self.access_log is not None:
            self.access_log.flush()  # the last turn's lines
        log.info("stopped")
        await send({"type": "lifespan.shutdown.complete"})


def create_app(
    settings: config.Settings | None = None, sinks: Sequence[RecordSink] = ()
) -> RLServeApp:
    """The application; ``sinks`` receive every executed batch (``serve.batching.record``)."""
    settings = single_file.as_repository(settings or config.load())
    metrics = Metrics()
    register_metrics(metrics)
    manager = ModelRepositoryManager(settings, metrics, sinks)
    registry = WorkerRegistry(manager, stale_after_s=max(3 * settings.sync_interval_s, 5.0))
    updater = Updater(manager, settings, metrics, registry)
    phases = ServerPhases()
    canaries = CanaryEvidence(manager, updater, metrics)
    manager.add_sink(ShadowMirror(manager, canaries))
    episodes = EpisodeBook(metrics)
    state = ServerState(settings, manager, phases, metrics, updater, episodes, canaries)
    turn = LoopTurn()
    access_log = AccessLog() if settings.access_log else None
    http_calls = HttpCalls(metrics, lambda: phases.draining, access_log=access_log)
    transports = _transports(state, http_calls, turn)
    parts = FrontendParts(manager, manager.kind_of, http_calls, settings, turn)
    control = _control_app(state, access_log)
    return RLServeApp(state, control, _routes(transports, parts), transports, turn, access_log)


def _transports(state: ServerState, http_calls: HttpCalls, turn: LoopTurn) -> Transports:
    """The shared transports: predict and /v2 on the HTTP port, and the gRPC and lane
    listeners when their settings ask for them."""
    settings, manager, metrics, phases = state.settings, state.manager, state.metrics, state.phases

    def draining() -> bool:
        return phases.draining

    rows = RowCalls(turn)  # the steps of every frontend's call to a model of rows
    feature_lookup = FeatureLookup(metrics)  # models with a features view, every frontend's
    frontend = predict.PredictFrontend(
        manager, http_calls, settings.max_body_bytes, rows=rows, features=feature_lookup
    )
    shared_memory = SharedMemory(
        enabled=settings.allow_client_shm,
        max_regions=settings.shm_max_regions,
        max_region_bytes=settings.shm_max_region_bytes,
        admin_token=None if settings.shm_open else settings.admin_token,
    )
    inference = Inference(manager, metrics, draining, rows, shared_memory, feature_lookup)
    v2 = oip_rest.OipRestFrontend(
        manager, inference, state.unready_reasons, http_calls, settings.max_body_bytes
    )
    grpc = None
    if settings.grpc_port is not None:
        service = oip_rpc.InferenceService(
            manager,
            inference,
            state.unready_reasons,
            stream_max_in_flight=settings.grpc_stream_max_in_flight,
        )
        grpc = GrpcServer(
            service,
            oip_rpc.HealthService(state.unready_reasons),
            f"{settings.host}:{settings.grpc_port}",
            settings.max_body_bytes,
        )
    lane = None
    if settings.lane is not None:
        limits = LaneLimits(settings.lane_max_rows, settings.lane_max_connections)
        serving = LaneServing(settings.lane_serving)
        lane = LaneServer(
            settings.lane, inference, limits, draining,
            serving=serving, spin_us=settings.lane_spin_us,
        )  # fmt: skip
    return Transports(frontend, v2, grpc, lane)


def _routes(transports: Transports, parts: FrontendParts) -> list[RouteEntry]:
    """The data plane's route table: the predict routes (or the model's kind, when it
    answers them itself), /v2, then each kind's own routes."""
    kinds = {plugin.kind: plugin.frontends(parts) for plugin in plugins()}
    by_kind = {kind: own.predict for kind, own in kinds.items() if own.predict is not None}
    answer_predict = PredictRoutes(transports.predict, parts.kind_of, by_kind)
    return [
        RouteEntry(predict.PREFIXES, predict.match, answer_predict, answer_predict.now),
        RouteEntry(oip_rest.PREFIXES, oip_rest.match, transports.v2, transports.v2.answer_now),
        *(entry for own in kinds.values() for entry in own.own),
    ]


class PredictRoutes:
    """The predict routes: the predict frontend's, unless the model's kind answers them
    itself (a language model: predict means generate)."""

    def __init__(
        self,
        frontend: predict.PredictFrontend,
        kind_of: Callable[[str | None], ModelKind | None],
        by_kind: dict[ModelKind, Answer],
    ) -> None:
        self.frontend = frontend
        self.kind_of = kind_of
        self.by_kind = by_kind

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, path: predict.PredictPath
    ) -> None:
        kind = self.kind_of(path.model) if self.by_kind else None
        answer = None if kind is None else self.by_kind.get(kind)
        if answer is not None:
            await answer(scope, receive, send, path)
            return
        await self.frontend(scope, receive, send, path)

    def now(
        self, scope: Scope, body: bytes, responder: Responder, path: predict.PredictPath
    ) -> bool:
        """The predict frontend's answer without a task, for a model of rows."""
        if self.by_kind and self.kind_of(path.model) in self.by_kind:
            return False
        return self.frontend.answer_now(scope, body, responder, path)


@dataclass(frozen=True)
class Transports:
    """The shared transports the process starts and stops (the kinds' own frontends hold
    nothing to close)."""

    predict: predict.PredictFrontend
    v2: oip_rest.OipRestFrontend
    grpc: GrpcServer | None
    lane: LaneServer | None


def _control_app(state: ServerState, access_log: AccessLog | None) -> ASGIApp:
    app = FastAPI(
        title="rlserve",
        version=__version__,
        summary="A batching policy server for reinforcement-learning policies",
    )
    models = ModelEndpoints(state.manager)
    app.add_api_route("/v1/models", _model_list(state, models), include_in_schema=False)
    app.include_router(models.router())
    app.include_router(AdminEndpoints(state.updater, state.settings).router())
    token = state.settings.episode_token
    episodes = EpisodeEndpoints(state.manager, state.episodes, state.canaries, token)
    app.include_router(episodes.router())
    app.include_router(
        OperationsEndpoints(state.manager, state.phases, state.metrics, state.settings).router()
    )
    openapi.install(app)
    app.add_exception_handler(RLServeError, _rlserve_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected_error)
    phases = state.phases
    return AccessMiddleware(app, lambda: phases.draining, access_log)


def _model_list(state: ServerState, models: ModelEndpoints) -> Callable[[], Awaitable[Response]]:
    """GET /v1/models: rlserve's listing (``models``: every model, its state and versions)
    with OpenAI's beside it (``object``, ``data``: the language models, which the
    OpenAI-compatible routes serve), so that ``client.models.list()`` works too."""
    started = int(time.time())

    async def list_models() -> Response:
        listing = orjson.loads((await models.list_models()).body)
        added: dict[str, Any] = {}
        for plugin in plugins():
            if plugin.listing is not None:
                kind = [n for n, m in state.manager.models.items() if m.kind is plugin.kind]
                added |= plugin.listing(kind, started)
        return json_response({**added, **listing})

    return list_models


async def _load(state: ServerState) -> None:
    """Load, verify and warm every model (while the server already answers /health, unless
    it listens after loading) and start the canaries their config.yaml declare, then follow
    the repository's serving state (and, in pull mode, watch it for new versions and
    models)."""
    try:
        loaded = await _load_models(state)
        for name in list(state.manager.models) if loaded else []:
            await state.updater.start_configured_canary(name)
    finally:
        state.manager.canaries_started = True
        state.phases.loaded.set()
    if loaded:
        _ready(state)  # once the canaries started: what keeps /ready red is known now
    else:
        await _load_when_back(state)
    settings, updater = state.settings, state.updater
    sync = RepositorySync(state.manager, updater, updater.registry, settings.sync_interval_s)
    followers = [sync.run()]
    if settings.poll_interval_s is not None:
        watcher = RepositoryWatcher(state.manager, updater, settings.poll_interval_s)
        followers.append(watcher.run())
    await asyncio.gather(*followers)


async def _sample_load(manager: ModelRepositoryManager) -> None:
    """The load gauges, from the schedulers' state, every LOAD_SAMPLE_S (the request path
    never touches them)."""
    while True:
        manager.sample_load()
        await asyncio.sleep(LOAD_SAMPLE_S)


async def _measure_turns(turn: LoopTurn) -> None:
    """How long one turn of the event loop takes, every TURN_SAMPLE_S: under overload a
    request waits about a turn before its handler runs, which its deadline must count."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(TURN_SAMPLE_S)
        started = loop.time()
        await asyncio.sleep(0)  # back after one turn
        turn.observe(loop.time() - started)


async def _load_models(state: ServerState, *, quiet: bool = False) -> bool:
    """Load the repository; False (and /ready red, saying why) when it cannot be."""
    try:
        await state.manager.load_all()
    except RLServeError as exc:
        state.manager.fatal = exc.message
        if not quiet:
            log.error("cannot load the model repository: %s", exc.message)
        return False
    state.manager.fatal = None
    return True


async def _load_when_back(state: ServerState) -> None:
    """A repository missing at start (moved away for a while: a worker restarted in the
    meantime) is looked for again every REPOSITORY_RETRY_S; /ready stays red meanwhile."""
    while True:
        await asyncio.sleep(REPOSITORY_RETRY_S)
        if await _load_models(state, quiet=True):
            log.info("the model repository is back: %s", state.settings.model_repository)
            _ready(state)
            return


def _ready(state: ServerState) -> None:
    memory.freeze()
    state.phases.ready()
    for reason in state.manager.unready_reasons():
        log.error("not ready: %s", reason)


async def _rlserve_error(request: Request, exc: RLServeError) -> Response:
    return error_response(exc)


_HTTP_ERRORS: dict[int, type[RLServeError]] = {404: NotFound, 405: MethodNotAllowed}


async def _http_error(request: Request, exc: HTTPException) -> Response:
    message = f"{request.method} {request.url.path}: {exc.detail}"
    kind = _HTTP_ERRORS.get(exc.status_code)
    if kind is not None:
        return error_response(kind(message))
    return json_response({"error": {"code": "http_error", "message": message}}, exc.status_code)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return error_response(MalformedRequest(f"{where}: {first['msg']}"))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(internal_error(exc))
