"""The model endpoints: what the repository serves, each model's versions and contracts.

Errors are raised as RLServeError and rendered by the control-plane application
(``serve.process.app``).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from serve.control.http_bodies import json_response
from serve.control.manager import ModelRepositoryManager


class ModelEndpoints:
    def __init__(self, manager: ModelRepositoryManager) -> None:
        self.manager = manager

    def router(self) -> APIRouter:
        router = APIRouter(tags=["models"])
        router.add_api_route("/v1/models", self.list_models, methods=["GET"])
        router.add_api_route("/v1/models/{model}", self.describe_model, methods=["GET"])
        return router

    async def list_models(self) -> Response:
        """Every model in the repository, its state and loaded versions."""
        models = [
            {
                "name": m.name,
                "state": m.state.value,
                "active_version": m.active,
                "versions": [v.version for v in m.resident()],
            }
            for m in self.manager.models.values()
        ]
        return json_response({"models": models})

    async def describe_model(self, model: str) -> Response:
        """A model's versions with their policy contracts, and its batching configuration."""
        return json_response(self.manager.describe(model))
