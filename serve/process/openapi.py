"""The predict request as documentation: shown in /docs, never used to validate.

Validation happens against each model's policy contract (``serve.spaces``), which knows
shapes and bounds that a static schema cannot.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from serve.types import OutputKind


class PredictRequest(BaseModel):
    observations: Any = Field(
        description="One observation, or a list of them (an N-env vector), shaped as the "
        "model's observation space (GET /v1/models/{model} shows its contract). For a Dict "
        "space: an object of key to value, or a list of such objects.",
        examples=[[0.01, -0.02, 0.03, 0.04]],
    )
    actions: Any = Field(
        None,
        description="Optional: actions already taken, one per observation; log_probs then "
        "scores these actions instead of choosing new ones (what a trainer needs).",
    )
    deterministic: bool = Field(True, description="the policy's mode, or a sampled action")
    seed: int | None = Field(None, ge=0, description="makes sampled actions reproducible")
    outputs: list[OutputKind] = Field(
        default=[OutputKind.ACTIONS],
        description="what to return: actions, log_probs, values, distribution",
    )


_RESPONSES = {
    "200": {"description": "model, model_version and the requested outputs"},
    "400": {"description": "malformed JSON or header"},
    "404": {"description": "unknown model or version"},
    "413": {"description": "body larger than max_body_bytes"},
    "422": {"description": "observations do not fit the contract (shape, dtype, bounds)"},
    "429": {"description": "queue full; see Retry-After"},
    "503": {"description": "not ready, or shutting down"},
    "504": {"description": "deadline passed"},
}
_REF = "#/components/schemas/{model}"


def _operation(summary: str, params: list[str]) -> dict[str, Any]:
    return {
        "post": {
            "tags": ["predict"],
            "summary": summary,
            "parameters": [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                for p in params
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": _REF.format(model="PredictRequest")}}
                },
            },
            "responses": _RESPONSES,
        }
    }


PREDICT_PATHS = {
    "/predict": _operation("Predict with the default model's latest version", []),
    "/v1/models/{model}/predict": _operation("Predict with a model's latest version", ["model"]),
    "/v1/models/{model}/versions/{version}/predict": _operation(
        "Predict with one version of a model", ["model", "version"]
    ),
}


def install(app: FastAPI) -> None:
    """Serve an OpenAPI schema that includes the predict routes."""

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            spec["paths"] = {**PREDICT_PATHS, **spec.get("paths", {})}
            request = PredictRequest.model_json_schema(ref_template=_REF)
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            components.update(request.pop("$defs", {}))
            components["PredictRequest"] = request
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]
