"""OpenAI request bodies as generate calls, and errors in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import pytest

from serve.errors import InvalidInput, NotFound, QueueFull
from serve.lm.frontends.openai_answers import error
from serve.lm.frontends.openai_http import match
from serve.lm.frontends.openai_requests import Endpoint, parse


def test_a_completion_becomes_the_native_generate_fields() -> None:
    call = parse(
        Endpoint.COMPLETIONS,
        {"model": "m", "prompt": ["The cat"], "max_tokens": 5, "temperature": 0, "stop": ".",
         "n": 1, "logprobs": 0, "user": "someone", "stream": True,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert call.model == "m"
    assert call.generate == {
        "prompt": "The cat",
        "max_new_tokens": 5,
        "temperature": 0,
        "stop": ".",
    }
    assert (call.options.stream, call.options.include_usage, call.options.logprobs) == (
        True,
        True,
        True,
    )


def test_a_chat_takes_text_parts_and_either_budget_name() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [{"role": "user", "content": parts}]
    call = parse(Endpoint.CHAT, {"model": "m", "messages": messages, "max_tokens": 3})
    assert call.generate["messages"] == [{"role": "user", "content": "ab"}]
    assert call.generate["max_new_tokens"] == 3
    newer = parse(Endpoint.CHAT, {"model": "m", "messages": messages, "max_completion_tokens": 4})
    assert newer.generate["max_new_tokens"] == 4
    renamed = newer.renamed(InvalidInput("max_new_tokens: 4 is beyond the context"))
    assert renamed.message == "max_completion_tokens: 4 is beyond the context"


@pytest.mark.parametrize(
    ("endpoint", "body", "words"),
    [
        (Endpoint.COMPLETIONS, {"prompt": "a", "n": 2}, "n: 2 is not supported"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "echo": True}, "echo: true is not supported"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "logprobs": True}, "got true"),
        (Endpoint.COMPLETIONS, {"prompt": [1, 2]}, "prompt: token ids"),
        (Endpoint.COMPLETIONS, {"prompt": ["a", "b"]}, "prompt: 2 prompts"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "logprobs": 1}, "logprobs: 1 asks"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "logprobs": True}, "logprobs: expected an integer"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "messages": []}, "messages: not a field"),
        (Endpoint.CHAT, {"messages": [], "top_logprobs": 2}, "top_logprobs: 2 asks"),
        (Endpoint.CHAT, {"messages": [], "max_tokens": 2, "max_completion_tokens": 3},
         "max_completion_tokens: 3 while max_tokens is 2"),
        (Endpoint.CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0]: a image_url part"),
        (Endpoint.CHAT, {"messages": [], "tools": [{"type": "function"}]}, "tools: "),
        (Endpoint.CHAT, {"messages": [], "stream": "yes"}, "stream: expected true or false"),
        (Endpoint.CHAT, {"messages": [], "parallel_tool_calls": "yes"},
         "parallel_tool_calls: expected true or false, got \"yes\""),
        (Endpoint.CHAT, {"messages": [], "parallel_tool_calls": 1},
         "parallel_tool_calls: expected true or false, got 1"),
    ],
)  # fmt: skip
def test_what_is_not_supported_is_refused_by_name(
    endpoint: Endpoint, body: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse(endpoint, {"model": "m", **body})
    assert words in caught.value.message


@pytest.mark.parametrize("value", [True, False, None])
def test_parallel_tool_calls_takes_a_boolean(value: bool | None) -> None:
    body: dict[str, Any] = {"model": "m", "messages": [], "parallel_tool_calls": value}
    assert parse(Endpoint.CHAT, body).model == "m"


def test_a_missing_model_is_refused() -> None:
    with pytest.raises(InvalidInput, match="model: expected the name of a served model"):
        parse(Endpoint.COMPLETIONS, {"prompt": "a"})


def test_errors_have_openai_shape_and_status() -> None:
    invalid = error(InvalidInput("max_tokens: 400 is beyond the context"))
    assert invalid.status == 400
    assert invalid.body == {
        "error": {
            "message": "max_tokens: 400 is beyond the context",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "invalid_input",
        }
    }
    unknown = error(NotFound("model 'x': unknown model; loaded models: ['m']"))
    assert unknown.status == 404
    assert unknown.body["error"]["code"] == "model_not_found"
    assert unknown.body["error"]["param"] == "model"
    full = error(QueueFull("queue full"))
    assert (full.status, full.body["error"]["type"]) == (429, "rate_limit_error")


def test_paths() -> None:
    assert match("/v1/completions") is Endpoint.COMPLETIONS
    assert match("/v1/chat/completions") is Endpoint.CHAT
    assert match("/v1/models") is None
    assert match("/v1/completions/x") is None
