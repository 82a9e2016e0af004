"""A language model's routes as documentation: native generate and score, and the
OpenAI-compatible completions (shown in /docs, never used to validate: the model's contract
and tokenizer know the context lengths a static schema cannot)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from serve.frontends.lm.openai_requests import MAX_PROMPTS
from serve.frontends.openapi import RESPONSES, OpenApiPart, operation


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


_LM_RESPONSES = {
    **{k: v for k, v in RESPONSES.items() if k != "200"},
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
    **{k: v for k, v in RESPONSES.items() if k in ("413", "429", "503", "504")},
}


def _lm(summary: str, params: list[str], request: str) -> dict[str, Any]:
    return operation(summary, params, request, tag="language models", responses=_LM_RESPONSES)


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
    return operation(summary, [], request, tag="openai", responses=_OPENAI_RESPONSES)


OPENAI_PATHS = {
    "/v1/completions": _openai("OpenAI-compatible completion of a prompt", "CompletionRequest"),
    "/v1/chat/completions": _openai("OpenAI-compatible chat completion", "ChatCompletionRequest"),
}
PART = OpenApiPart(
    {**LANGUAGE_MODEL_PATHS, **OPENAI_PATHS},
    [GenerateRequest, ScoreRequest, CompletionRequest, ChatCompletionRequest],
)
