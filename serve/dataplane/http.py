"""The predict endpoints: the hot path, as plain Starlette routes.

They skip FastAPI's dependency solving (a third of the per-request cost for policies this
small); ``serve.process.openapi`` documents them. Errors are raised as RLServeError and rendered
by ``serve.process.app``, like everywhere else.
"""

from __future__ import annotations

import asyncio
import time

from starlette import routing
from starlette.requests import Request
from starlette.responses import Response

from serve.control.manager import Route
from serve.dataplane.dynamic_batcher import Stamped
from serve.dataplane.wire import deadline_ms, json_response, read_json_object
from serve.errors import DeadlineExceeded, NotFound, RLServeError
from serve.process import state as server_state
from serve.process.state import ServerState


async def predict_default(request: Request) -> Response:
    return await _predict(request, None, None)


async def predict_model(request: Request) -> Response:
    return await _predict(request, request.path_params["model"], None)


async def predict_version(request: Request) -> Response:
    version = _version_number(request.path_params["version"])
    return await _predict(request, request.path_params["model"], version)


ROUTES = [
    routing.Route("/predict", predict_default, methods=["POST"]),
    routing.Route("/v1/models/{model}/predict", predict_model, methods=["POST"]),
    routing.Route(
        "/v1/models/{model}/versions/{version}/predict", predict_version, methods=["POST"]
    ),
]


async def _predict(request: Request, model: str | None, version: int | None) -> Response:
    state = server_state.of(request)
    started = time.monotonic()
    label = model or "default"
    state.metrics.inflight.inc()
    try:
        route = state.registry.resolve(model, version)
        label = route.entry.name
        stamped = await _serve(request, state, route, started)
        state.metrics.count(label, stamped.version, 200)
        return _render(label, stamped)
    except RLServeError as exc:
        state.metrics.count(label, version, exc.status)
        state.metrics.rejections.labels(label, exc.code).inc()
        raise
    finally:
        state.metrics.inflight.dec()
        state.metrics.request_latency.labels(label).observe(time.monotonic() - started)


async def _serve(request: Request, state: ServerState, route: Route, started: float) -> Stamped:
    payload = await read_json_object(request, state.settings.max_body_bytes)
    prepared = route.model.prepare(payload)
    budget_s = deadline_ms(request, route.entry.settings.default_deadline_ms) / 1000
    if time.monotonic() >= started + budget_s:  # spent reading and validating: never queue it
        raise DeadlineExceeded(
            f"the request's deadline of {budget_s * 1000:g} ms passed on admission"
        )
    future = route.entry.batcher.submit(prepared, started + budget_s, route.pinned)
    return await _within(future, started + budget_s - time.monotonic(), budget_s)


def _render(model: str, stamped: Stamped) -> Response:
    """The answer, stamped with the version that computed it (body and headers)."""
    body = {"model": model, "model_version": stamped.version, "model_sha256": stamped.sha256}
    headers = {"X-Policy-Version": str(stamped.version), "X-Policy-SHA256": stamped.sha256}
    return json_response({**body, **stamped.answer}, headers=headers)


async def _within(future: asyncio.Future[Stamped], remaining_s: float, budget_s: float) -> Stamped:
    """The answer, or DeadlineExceeded once the budget is spent (a timer, not a task)."""
    timer = asyncio.get_running_loop().call_later(max(remaining_s, 0.0), _expire, future, budget_s)
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Stamped], budget_s: float) -> None:
    if not future.done():
        future.set_exception(
            DeadlineExceeded(f"no answer within the request's deadline of {budget_s * 1000:g} ms")
        )


def _version_number(text: str) -> int:
    if not text.isdigit():
        raise NotFound(f"version {text!r}: versions are non-negative integers")
    return int(text)
