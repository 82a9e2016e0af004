"""The predict endpoints: the hot path, as plain Starlette routes.

They skip FastAPI's dependency solving (a third of the per-request cost for policies this
small); ``serve.openapi`` documents them. Errors are raised as RLServeError and rendered
by ``serve.app``, like everywhere else.
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve import state as server_state
from serve.errors import DeadlineExceeded, NotFound, RLServeError, ServiceUnavailable
from serve.registry import VersionEntry
from serve.state import ServerState
from serve.types import Answer
from serve.wire import deadline_ms, json_response, read_json_object


async def predict_default(request: Request) -> Response:
    return await _predict(request, None, None)


async def predict_model(request: Request) -> Response:
    return await _predict(request, request.path_params["model"], None)


async def predict_version(request: Request) -> Response:
    version = _version_number(request.path_params["version"])
    return await _predict(request, request.path_params["model"], version)


ROUTES = [
    Route("/predict", predict_default, methods=["POST"]),
    Route("/v1/models/{model}/predict", predict_model, methods=["POST"]),
    Route("/v1/models/{model}/versions/{version}/predict", predict_version, methods=["POST"]),
]


async def _predict(request: Request, model: str | None, version: int | None) -> Response:
    state = server_state.of(request)
    started = time.monotonic()
    label = model or "default"
    state.metrics.inflight.inc()
    try:
        entry = _admit(state, model, version)
        label = entry.model.name
        response = await _serve(request, state, entry, started)
        state.metrics.count(label, entry.model.version, 200)
        return response
    except RLServeError as exc:
        state.metrics.count(label, version, exc.status)
        state.metrics.rejections.labels(label, exc.code).inc()
        raise
    finally:
        state.metrics.inflight.dec()
        state.metrics.request_latency.labels(label).observe(time.monotonic() - started)


def _admit(state: ServerState, model: str | None, version: int | None) -> VersionEntry:
    if not state.lifecycle.serving:
        raise ServiceUnavailable("server is shutting down; retry on another replica")
    return state.registry.resolve(model, version)


async def _serve(
    request: Request, state: ServerState, entry: VersionEntry, started: float
) -> Response:
    payload = await read_json_object(request, state.settings.max_body_bytes)
    prepared = entry.model.prepare(payload)
    budget_s = deadline_ms(request, entry.settings.default_deadline_ms) / 1000
    future = entry.batcher.submit(prepared, started + budget_s)
    answer = await _within(future, started + budget_s - time.monotonic(), budget_s)
    body = {"model": entry.model.name, "model_version": entry.model.version, **answer}
    return json_response(body, headers={"X-Policy-Version": str(entry.model.version)})


async def _within(future: asyncio.Future[Answer], remaining_s: float, budget_s: float) -> Answer:
    """The answer, or DeadlineExceeded once the budget is spent (a timer, not a task)."""
    timer = asyncio.get_running_loop().call_later(max(remaining_s, 0.0), _expire, future, budget_s)
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Answer], budget_s: float) -> None:
    if not future.done():
        future.set_exception(
            DeadlineExceeded(f"no answer within the request's deadline of {budget_s * 1000:g} ms")
        )


def _version_number(text: str) -> int:
    if not text.isdigit():
        raise NotFound(f"version {text!r}: versions are non-negative integers")
    return int(text)
