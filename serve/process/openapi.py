"""The data plane's routes as documentation: shown in /docs, never used to validate.

The predict routes, and each kind's own routes (``serve.plugins``: a language model's
generate, score and OpenAI-compatible routes, ``serve.frontends.lm.openapi``), are answered
by lean frontends outside FastAPI (``serve.process.app``); their requests are described
here and in the kinds' parts. Validation happens against each model's policy contract
(``kernel.spaces``, ``serve.lm``), which knows shapes, bounds and context lengths that a
static schema cannot.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from serve.frontends.openapi import REF, OpenApiPart, operation
from serve.plugins import plugins
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
    action_masks: Any = Field(
        None,
        description="For a policy that acts under action masks (MaskablePPO): one row of "
        "booleans per observation, true where an action is legal (the contract's "
        "action_mask input gives the width).",
    )
    state: Any = Field(
        None,
        description="For a recurrent policy (RecurrentPPO): the state the previous answer of "
        "the episode returned, one row of floats per observation (the contract's state "
        "layout gives the width); leave it out when every observation starts an episode.",
    )
    episode_start: Any = Field(
        None,
        description="For a recurrent policy: true where an observation begins an episode "
        "(its state is reset to zeros); one boolean per observation, or one for all.",
    )
    deterministic: bool = Field(True, description="the policy's mode, or a sampled action")
    seed: int | None = Field(None, ge=0, description="makes sampled actions reproducible")
    outputs: list[OutputKind] = Field(
        default=[OutputKind.ACTIONS],
        description="what to return: actions, log_probs, values, q_values, distribution",
    )


PREDICT_PATHS = {
    "/predict": operation("Predict with the default model's latest version", []),
    "/v1/models/{model}/predict": operation("Predict with a model's latest version", ["model"]),
    "/v1/models/{model}/versions/{version}/predict": operation(
        "Predict with one version of a model", ["model", "version"]
    ),
}


PREDICT = OpenApiPart(PREDICT_PATHS, [PredictRequest])
_MODEL_LIST = (
    "Every model, its state and loaded versions (models); beside them, OpenAI's list of the "
    "language models (object: list, data), which OpenAI clients read"
)


def install(app: FastAPI) -> None:
    """Serve an OpenAPI schema that includes the data plane's routes."""

    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            paths = spec.get("paths", {})
            listing = paths.get("/v1/models", {}).get("get")
            if listing is not None:
                listing["description"] = _MODEL_LIST
            parts = [PREDICT, *(p.openapi for p in plugins() if p.openapi is not None)]
            spec["paths"] = {k: v for part in parts for k, v in part.paths.items()} | paths
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            for model in (request for part in parts for request in part.requests):
                request = model.model_json_schema(ref_template=REF)
                components.update(request.pop("$defs", {}))
                components[model.__name__] = request
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]
