"""The ASGI application: ``create_app()`` builds it (gunicorn: ``serve.process.app:create_app()``).

Settings are read when the app is created, never at import. Errors of every kind become
``{"error": {"code": ..., "message": ...}}`` here, and only here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from serve import __version__, config
from serve.control import admin
from serve.control import api as routes
from serve.control.manager import Registry
from serve.control.updates import Updater
from serve.control.watcher import RepositoryWatcher
from serve.dataplane import http as predict
from serve.dataplane.wire import error_response, json_response
from serve.errors import MalformedRequest, RLServeError
from serve.metrics import Metrics
from serve.process import openapi
from serve.process.access import AccessMiddleware
from serve.process.phases import Lifecycle
from serve.process.state import ServerState

log = logging.getLogger("rlserve.app")

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def create_app(settings: config.Settings | None = None) -> FastAPI:
    settings = settings or config.load()
    metrics = Metrics()
    registry = Registry(settings, metrics)
    updater = Updater(registry, settings, metrics)
    state = ServerState(settings, registry, Lifecycle(), metrics, updater)
    app = FastAPI(
        title="rlserve",
        version=__version__,
        summary="A batching policy server for reinforcement-learning policies",
        lifespan=_lifespan,
    )
    app.state.rlserve = state
    app.router.routes.extend(predict.ROUTES)
    app.include_router(routes.router)
    app.include_router(admin.router)
    openapi.install(app)
    app.add_exception_handler(RLServeError, _rlserve_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_middleware(
        AccessMiddleware, lifecycle=state.lifecycle, log_requests=settings.access_log
    )
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.rlserve
    loading = asyncio.create_task(_load(state), name="rlserve-load")  # then the watcher
    if state.lifecycle.listen_after_load:
        await state.lifecycle.loaded.wait()  # uvicorn listens once the lifespan has started
    try:
        yield
    finally:
        state.lifecycle.begin_stop()
        loading.cancel()
        await state.registry.stop()
        log.info("stopped")


async def _load(state: ServerState) -> None:
    """Load, verify and warm every model (while the server already answers /health, unless
    it listens after loading), then watch the repository if asked to."""
    try:
        loaded = await _load_models(state)
    finally:
        state.lifecycle.loaded.set()
    if loaded and state.settings.poll_interval_s is not None:
        await RepositoryWatcher(state.registry, state.updater, state.settings.poll_interval_s).run()


async def _load_models(state: ServerState) -> bool:
    try:
        await state.registry.load_all()
    except RLServeError as exc:
        state.registry.fatal = exc.message
        log.error("cannot load the model repository: %s", exc.message)
        return False
    state.lifecycle.ready()
    for reason in state.registry.unready_reasons():
        log.error("not ready: %s", reason)
    return True


async def _rlserve_error(request: Request, exc: RLServeError) -> Response:
    return error_response(exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return json_response({"error": {"code": code, "message": message}}, exc.status_code)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return error_response(MalformedRequest(f"{where}: {first['msg']}"))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(RLServeError(f"internal error: {type(exc).__name__}; see the server log"))
