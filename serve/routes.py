"""The HTTP endpoints. Errors are raised as RLServeError and rendered by ``serve.app``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from serve import state as server_state
from serve.errors import DeadlineExceeded, NotFound, RLServeError, ServiceUnavailable
from serve.openapi import PREDICT_OPENAPI
from serve.registry import VersionEntry
from serve.state import ServerState
from serve.wire import deadline_ms, json_response, read_json_object

router = APIRouter()


# ---------------------------------------------------------------------- predict


@router.post("/predict", tags=["predict"], openapi_extra=PREDICT_OPENAPI)
async def predict_default(request: Request) -> Response:
    """Predict with the default model's latest version."""
    return await _predict(request, None, None)


@router.post("/v1/models/{model}/predict", tags=["predict"], openapi_extra=PREDICT_OPENAPI)
async def predict_model(request: Request, model: str) -> Response:
    """Predict with a model's latest loaded version."""
    return await _predict(request, model, None)


@router.post(
    "/v1/models/{model}/versions/{version}/predict", tags=["predict"], openapi_extra=PREDICT_OPENAPI
)
async def predict_version(request: Request, model: str, version: str) -> Response:
    """Predict with one version of a model."""
    return await _predict(request, model, _version_number(version))


async def _predict(request: Request, model: str | None, version: int | None) -> Response:
    state = server_state.of(request)
    started = time.monotonic()
    label = model or "default"
    state.metrics.inflight.inc()
    try:
        entry = _admit(state, model, version)
        label = entry.model.name
        response = await _serve(request, state, entry, started)
        _count(state, entry, "200")
        return response
    except RLServeError as exc:
        _count_error(state, label, version, exc)
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
    remaining = started + budget_s - time.monotonic()
    try:
        answer = await asyncio.wait_for(future, max(remaining, 0.0))
    except TimeoutError:
        raise DeadlineExceeded(
            f"no answer within the request's deadline of {budget_s * 1000:g} ms"
        ) from None
    body = {"model": entry.model.name, "model_version": entry.model.version, **answer}
    return json_response(body, headers={"X-Policy-Version": str(entry.model.version)})


def _count(state: ServerState, entry: VersionEntry, status: str) -> None:
    state.metrics.requests.labels(entry.model.name, str(entry.model.version), status).inc()


def _count_error(state: ServerState, model: str, version: int | None, exc: RLServeError) -> None:
    state.metrics.requests.labels(model, str(version or ""), str(exc.status)).inc()
    state.metrics.rejections.labels(model, exc.code).inc()


def _version_number(text: str) -> int:
    if not text.isdigit():
        raise NotFound(f"version {text!r}: versions are non-negative integers")
    return int(text)


# ---------------------------------------------------------------------- models


@router.get("/v1/models", tags=["models"])
async def list_models(request: Request) -> Response:
    """Every model in the repository, its state and loaded versions."""
    registry = server_state.of(request).registry
    models = [
        {
            "name": m.name,
            "state": m.state.value,
            "versions": sorted(m.versions),
            "latest_version": m.latest,
        }
        for m in registry.models.values()
    ]
    return json_response({"models": models})


@router.get("/v1/models/{model}", tags=["models"])
async def describe_model(request: Request, model: str) -> Response:
    """A model's versions with their policy contracts, and its batching configuration."""
    return json_response(server_state.of(request).registry.describe(model))


# ---------------------------------------------------------------------- operations


@router.get("/health", tags=["operations"])
async def health(request: Request) -> Response:
    """Liveness: the process answers and no batch worker is dead or stuck."""
    state = server_state.of(request)
    now = time.monotonic()
    problems = [
        f"{e.model.name}/{e.model.version}: "
        + ("batch worker stopped" if not e.batcher.alive else "batch running for too long")
        for e in state.registry.entries()
        if (not e.batcher.alive and state.lifecycle.serving)
        or e.batcher.stuck_for(now) > state.settings.stuck_batch_s
    ]
    if problems:
        return json_response({"status": "unhealthy", "problems": problems}, 503)
    return json_response({"status": "ok"})


@router.get("/ready", tags=["operations"])
async def ready(request: Request) -> Response:
    """Readiness: models loaded, verified and warm, and the server is not draining."""
    state = server_state.of(request)
    reasons = state.registry.unready_reasons()
    if state.lifecycle.draining:
        reasons.insert(0, f"server is {state.lifecycle.phase.value}")
    body: dict[str, Any] = {
        "status": "ready" if not reasons else "not ready",
        "phase": state.lifecycle.phase.value,
    }
    if reasons:
        return json_response({**body, "reasons": reasons}, 503, {"Retry-After": "1"})
    return json_response(body)


@router.get("/metrics", tags=["operations"])
async def metrics(request: Request) -> Response:
    """Prometheus metrics (every gunicorn worker of this pod summed)."""
    text, content_type = server_state.of(request).metrics.render()
    return Response(text, media_type=content_type)
