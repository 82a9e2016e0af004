"""The model and operations endpoints (predict lives in ``serve.dataplane.http``, the hot path).

Errors are raised as RLServeError and rendered by ``serve.process.app``.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from serve.dataplane.wire import json_response
from serve.process import state as server_state

router = APIRouter()


# ---------------------------------------------------------------------- models


@router.get("/v1/models", tags=["models"])
async def list_models(request: Request) -> Response:
    """Every model in the repository, its state and loaded versions."""
    registry = server_state.of(request).registry
    models = [
        {
            "name": m.name,
            "state": m.state.value,
            "active_version": m.versions.active,
            "versions": [v.version for v in m.versions.resident()],
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
        f"{entry.name}: "
        + ("batch worker stopped" if not entry.batcher.alive else "batch running for too long")
        for entry in state.registry.models.values()
        if (not entry.batcher.alive and not state.lifecycle.stopping)
        or entry.batcher.stuck_for(now) > state.settings.stuck_batch_s
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
