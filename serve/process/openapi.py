"""The data plane's routes as documentation: shown in /docs, never used to validate.

The predict routes (actor-critic policies), the generate and score routes of language
models, and the OpenAI-compatible completion routes are answered by lean frontends
outside FastAPI (``serve.process.app``); their requests are described here. Validation
happens against each model's policy contract (``kernel.spaces``, ``serve.lm``), which knows
shapes, bounds and context lengths that a static schema cannot.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from serve.frontends.lm.openai_requests import MAX_PROMPTS
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


class GenerateRequest(BaseModel):
    prompt: str | list[int] | None = Field(
        None, description="the prompt, as text or token ids (or give messages)"
    )
    messages: list[dict[str, str]] | None = Field(
        None,
        description="a chat, rendered with the model's chat template (or give prompt)",
        examples=[[{"role": "user", "content": "Tell me about the fox."}]],
    )
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="new tokens at most (default: the model's generation defaults); "
        "generation stops when the context is full (finish_reason length)",
    )
    temperature: float | None = Field(None, ge=0, description="0: greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="0: no top-k cut")
    seed: int | None = Field(None, ge=0, description="makes sampling reproducible")
    stop: str | list[str] | None = Field(None, description="strings that end the text")
    stream: bool = Field(
        False,
        description="server-sent events: event: token per token, then event: result "
        "(or event: error)",
    )


class ScoreRequest(BaseModel):
    prompt: str | None = Field(None, description="the prompt, as text (or give messages)")
    messages: list[dict[str, str]] | None = Field(None, description="a chat (or give prompt)")
    completions: list[str] = Field(
        description="texts to score after the prompt: per-token log-probs and their sum",
        examples=[[" The cat sleeps.", " Rain falls."]],
    )


class _OpenAIRequest(BaseModel):
    model: str = Field(description="the name of a served language model (GET /v1/models)")
    temperature: float | None = Field(
        None, ge=0, description="0: greedy; absent: the model's generation defaults"
    )
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    n: Literal[1] | None = Field(None, description="one choice per prompt")
    stream: bool = Field(False, description="data: chunks, then data: [DONE]")
    stream_options: dict[str, bool] | None = Field(
        None, description='{"include_usage": true}: a last chunk with the token counts'
    )
    user: str | None = Field(None, description="accepted and ignored")


class CompletionRequest(_OpenAIRequest):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description=f"a prompt (text, or token ids), or a list of prompts (up to {MAX_PROMPTS}): "
        "one choice each, in order",
        examples=["The cat", [[265, 422], [11, 12]]],
    )
    max_tokens: int | None = Field(
        None, ge=1, description="new tokens at most; generation stops when the context is full"
    )
    logprobs: Literal[0] | None = Field(
        None, description="0: the chosen tokens' log-probs (top alternatives are not computed)"
    )


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[dict[str, Any]] = Field(
        examples=[[{"role": "user", "content": "Tell me about the fox."}]]
    )
    max_completion_tokens: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1, description="the former max_completion_tokens")
    logprobs: bool | None = Field(None, description="the chosen tokens' log-probs")
    top_logprobs: Literal[0] | None = Field(None, description="top alternatives: not computed")


_RESPONSES = {
    "200": {
        "description": "model, model_version, model_sha256 and the requested outputs "
        "(X-Policy-Version and X-Policy-SHA256 name the version; a model with a result cache "
        "adds X-Result-Cache: hit, miss or bypass)"
    },
    "400": {"description": "malformed JSON or header"},
    "404": {"description": "unknown model or version"},
    "413": {"description": "body larger than max_body_bytes"},
    "422": {"description": "observations do not fit the contract (shape, dtype, bounds)"},
    "429": {"description": "queue full; see Retry-After"},
    "503": {"description": "not ready, or shutting down"},
    "504": {"description": "deadline passed"},
}
_REF = "#/components/schemas/{model}"


_LM_RESPONSES = {
    **{k: v for k, v in _RESPONSES.items() if k != "200"},
    "200": {
        "description": "model, model_version, model_sha256 and the answer (X-Policy-Version "
        "names the version); with stream: text/event-stream"
    },
    "422": {"description": "the request does not fit (a field, the context length)"},
}
_OPENAI_RESPONSES = {
    "200": {
        "description": "OpenAI's completion (or chat.completion) object; system_fingerprint "
        "is rlserve-<model>-v<version>; with stream: data: chunks, then data: [DONE]"
    },
    "400": {"description": "malformed, or the request does not fit (error.param names it)"},
    "404": {"description": "unknown model (error.code: model_not_found)"},
    **{k: v for k, v in _RESPONSES.items() if k in ("413", "429", "503", "504")},
}


def _operation(
    summary: str,
    params: list[str],
    request: str = "PredictRequest",
    *,
    tag: str = "predict",
    responses: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "post": {
            "tags": [tag],
            "summary": summary,
            "parameters": [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                for p in params
            ],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": _REF.format(model=request)}}},
            },
            "responses": responses or _RESPONSES,
        }
    }


PREDICT_PATHS = {
    "/predict": _operation("Predict with the default model's latest version", []),
    "/v1/models/{model}/predict": _operation("Predict with a model's latest version", ["model"]),
    "/v1/models/{model}/versions/{version}/predict": _operation(
        "Predict with one version of a model", ["model", "version"]
    ),
}


def _lm(summary: str, params: list[str], request: str) -> dict[str, Any]:
    return _operation(summary, params, request, tag="language models", responses=_LM_RESPONSES)


LANGUAGE_MODEL_PATHS = {
    "/v1/models/{model}/generate": _lm(
        "Generate text with a language model's active version", ["model"], "GenerateRequest"
    ),
    "/v1/models/{model}/versions/{version}/generate": _lm(
        "Generate text with one version of a language model",
        ["model", "version"],
        "GenerateRequest",
    ),
    "/v1/models/{model}/score": _lm(
        "Per-token log-probs of completions after a prompt", ["model"], "ScoreRequest"
    ),
    "/v1/models/{model}/versions/{version}/score": _lm(
        "Per-token log-probs of completions, with one version",
        ["model", "version"],
        "ScoreRequest",
    ),
}


def _openai(summary: str, request: str) -> dict[str, Any]:
    return _operation(summary, [], request, tag="openai", responses=_OPENAI_RESPONSES)


OPENAI_PATHS = {
    "/v1/completions": _openai("OpenAI-compatible completion of a prompt", "CompletionRequest"),
    "/v1/chat/completions": _openai("OpenAI-compatible chat completion", "ChatCompletionRequest"),
}
_REQUESTS: list[type[BaseModel]] = [
    PredictRequest,
    GenerateRequest,
    ScoreRequest,
    CompletionRequest,
    ChatCompletionRequest,
]
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
            spec["paths"] = {**PREDICT_PATHS, **LANGUAGE_MODEL_PATHS, **OPENAI_PATHS, **paths}
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            for model in _REQUESTS:
                request = model.model_json_schema(ref_template=_REF)
                components.update(request.pop("$defs", {}))
                components[model.__name__] = request
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]
