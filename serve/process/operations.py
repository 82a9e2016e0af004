"""The operations endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from ops.gpu import gpu_utilization
from serve.config import Settings
from serve.control.http_bodies import json_response
from serve.control.manager import ModelRepositoryManager
from serve.metrics import Metrics
from serve.process.phases import ServerPhases
from serve.process.state import not_ready


class OperationsEndpoints:
    def __init__(
        self,
        manager: ModelRepositoryManager,
        phases: ServerPhases,
        metrics: Metrics,
        settings: Settings,
    ) -> None:
        self.manager = manager
        self.phases = phases
        self.metrics = metrics
        self.settings = settings

    def router(self) -> APIRouter:
        router = APIRouter(tags=["operations"])
        router.add_api_route("/health", self.health, methods=["GET"])
        router.add_api_route("/ready", self.ready, methods=["GET"])
        router.add_api_route("/metrics", self.render_metrics, methods=["GET"])
        return router

    async def health(self) -> Response:
        """Liveness: the process answers and no model's scheduler is stopped or stuck.

        The answer has the service guide's shape (``tests/serve/reference/health.json``):
        ``"status": "healthy"`` (``"unhealthy"`` with its ``problems`` and 503),
        ``model_version`` (the active version as a string, as the guide writes it: of the
        one model served, null when there are several or none is active yet) and
        ``gpu_utilization`` (0 to 1, null without a GPU); ``model_versions`` carries each
        model's active version. None of those facts makes it fail."""
        now = time.monotonic()
        stopping = self.phases.stopping
        problems = []
        for lifecycle in self.manager.models.values():
            scheduler = lifecycle.scheduler
            if not scheduler.alive and not stopping:
                problems.append(f"{lifecycle.name}: scheduler stopped")
            elif scheduler.stuck_for(now) > self.settings.stuck_batch_s:
                problems.append(f"{lifecycle.name}: batch running for too long")
        versions = {name: m.active for name, m in self.manager.models.items()}
        facts = {
            "model_version": _the_version(versions),
            "gpu_utilization": gpu_utilization(),
            "model_versions": versions,
        }
        if problems:
            return json_response({"status": "unhealthy", "problems": problems, **facts}, 503)
        return json_response({"status": "healthy", **facts})

    async def ready(self) -> Response:
        """Readiness: models loaded, verified and warm, and the server is not draining."""
        reasons = not_ready(self.manager, self.phases)
        body: dict[str, Any] = {
            "status": "ready" if not reasons else "not ready",
            "phase": self.phases.phase.value,
        }
        if reasons:
            return json_response({**body, "reasons": reasons}, 503, {"Retry-After": "1"})
        return json_response(body)

    async def render_metrics(self) -> Response:
        """Prometheus metrics (every gunicorn worker of this pod summed)."""
        self.metrics.flush()
        # Rendering reads every worker's files: off the event loop, whatever their size.
        text, content_type = await asyncio.to_thread(self.metrics.exposition)
        return Response(text, media_type=content_type)


def _the_version(versions: dict[str, int | None]) -> str | None:
    """The guide's ``model_version``: the one model's active version, written as every
    version is (``kernel.versions``), or None when there are several models or it has none."""
    if len(versions) != 1:
        return None
    (active,) = versions.values()
    return None if active is None else str(active)
