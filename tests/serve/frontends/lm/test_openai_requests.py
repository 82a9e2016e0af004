"""OpenAI request bodies as generate calls, and errors in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.errors import InvalidInput, NotFound, QueueFull
from serve.frontends.lm.openai_answers import error
from serve.frontends.lm.openai_http import match
from serve.frontends.lm.openai_requests import MAX_PROMPTS, Endpoint, OpenAICall, parse
from serve.lm.requests import generation_spec


def test_a_completion_becomes_the_native_generate_fields() -> None:
    call = parse(
        Endpoint.COMPLETIONS,
        {"model": "m", "prompt": ["The cat"], "max_tokens": 5, "temperature": 0, "stop": ".",
         "n": 1, "logprobs": 0, "user": "someone", "stream": True,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert call.model == "m"
    assert call.bodies == (
        {"prompt": "The cat", "max_new_tokens": 5, "temperature": 0, "stop": ".",
         "top_logprobs": 0},
    )  # fmt: skip
    assert (call.options.stream, call.options.include_usage, call.options.logprobs) == (
        True,
        True,
        True,
    )


def test_a_chat_takes_text_parts_and_either_budget_name() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [{"role": "user", "content": parts}]
    call = parse(Endpoint.CHAT, {"model": "m", "messages": messages, "max_tokens": 3})
    (body,) = call.bodies
    assert body["messages"] == [{"role": "user", "content": "ab"}]
    assert body["max_new_tokens"] == 3
    newer = parse(Endpoint.CHAT, {"model": "m", "messages": messages, "max_completion_tokens": 4})
    assert newer.bodies[0]["max_new_tokens"] == 4
    renamed = newer.renamed(InvalidInput("max_new_tokens: 4 is beyond the context"))
    assert renamed.message == "max_completion_tokens: 4 is beyond the context"


@pytest.mark.parametrize(
    ("endpoint", "body", "words"),
    [
        (Endpoint.COMPLETIONS, {"prompt": "a", "n": 0}, "n: expected an integer >= 1"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "n": True}, "n: expected an integer >= 1"),
        (Endpoint.COMPLETIONS, {"prompt": ["a", "b"], "n": 129},
         "n: 129 choices of 2 prompt(s) make 258; this server answers at most 256"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "echo": True, "stream": True},
         "echo: the prompt is repeated only in a whole answer"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "echo": 1}, "echo: expected true or false, got 1"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "logprobs": True}, "got true"),
        (Endpoint.COMPLETIONS, {"prompt": []}, "prompt: an empty list; give the prompt as text"),
        (Endpoint.COMPLETIONS, {"prompt": ["a"] * 257},
         "prompt: 257 prompts given; this server completes at most 256 prompts per call"),
        (Endpoint.COMPLETIONS, {"prompt": ["a", None]},
         "prompt[1]: expected a string of text or a list of token ids, got null"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "logprobs": 21},
         "logprobs: expected an integer in [0, 20], got 21"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "logprobs": True}, "logprobs: expected an integer"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "logprobs": -1}, "logprobs: expected an integer"),
        (Endpoint.COMPLETIONS, {"prompt": "a", "messages": []}, "messages: not a field"),
        (Endpoint.CHAT, {"messages": [], "top_logprobs": 2},
         'top_logprobs: 2 alternatives are given with the chosen tokens\' log-probs; send '
         '"logprobs": true with it'),
        (Endpoint.CHAT, {"messages": [{"role": "user", "content": "a"}], "logprobs": True,
          "top_logprobs": 21},
         "top_logprobs: expected an integer in [0, 20], got 21"),
        (Endpoint.CHAT, {"messages": [], "echo": True}, "echo: not a field"),
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
        parsed(endpoint, {"model": "m", **body})
    assert words in caught.value.message


def parsed(endpoint: Endpoint, payload: dict[str, Any]) -> OpenAICall:
    """Parsed, and every body checked as the native generate call it becomes (``checked``)."""
    call = parse(endpoint, payload)
    for index in range(len(call.bodies)):
        checked(call, index)
    return call


def test_alternatives_and_echo_become_native_fields_named_as_sent() -> None:
    completion = parsed(
        Endpoint.COMPLETIONS, {"model": "m", "prompt": "a", "logprobs": 3, "echo": True}
    )
    assert completion.bodies == ({"prompt": "a", "top_logprobs": 3, "echo": True},)
    assert completion.options.logprobs
    chat = parsed(
        Endpoint.CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "a"}], "logprobs": True,
         "top_logprobs": 5},
    )  # fmt: skip
    assert chat.bodies[0]["top_logprobs"] == 5
    plain = parsed(Endpoint.COMPLETIONS, {"model": "m", "prompt": "a"})
    assert plain.bodies == ({"prompt": "a"},)
    assert not plain.options.logprobs


@pytest.mark.parametrize(
    ("prompt", "prompts", "listed"),
    [
        ("The cat", ["The cat"], False),
        ([265, 422], [[265, 422]], False),  # token ids: one prompt
        (["The cat"], ["The cat"], True),
        (["The cat", "A dog"], ["The cat", "A dog"], True),
        ([[265, 422], [11, 12]], [[265, 422], [11, 12]], True),
        (["The cat", [11, 12]], ["The cat", [11, 12]], True),
    ],
)
def test_prompts_come_as_text_token_ids_or_lists_of_either(
    prompt: Any, prompts: list[Any], listed: bool
) -> None:
    call = parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": prompt, "max_tokens": 3})
    assert [body["prompt"] for body in call.bodies] == prompts
    assert all(body["max_new_tokens"] == 3 for body in call.bodies)
    assert call.listed is listed


def test_as_many_prompts_as_the_bound_are_taken() -> None:
    call = parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": ["a"] * MAX_PROMPTS})
    assert len(call.bodies) == MAX_PROMPTS


def checked(call: OpenAICall, index: int) -> None:
    """Choice ``index``'s body as the frontend checks it, its errors renamed."""
    try:
        generation_spec(dict(call.bodies[index]), "id", 0.0, 1.0)
    except InvalidInput as exc:
        raise call.renamed(exc, index) from None


@pytest.mark.parametrize(
    ("prompt", "index", "words"),
    [
        ([265, -1], 0, "prompt[1]: expected a token id (an integer >= 0), got -1"),
        ([265, True], 0, "prompt[1]: expected a token id (an integer >= 0), got true"),
        ([265, "a"], 0, 'prompt[1]: expected a token id (an integer >= 0), got "a"'),
        ([[265], []], 1, "prompt[1]: an empty list of token ids"),
        ([[265], [11, 2.5]], 1, "prompt[1][1]: expected a token id (an integer >= 0), got 2.5"),
        ([[265], [[11]]], 1, "prompt[1][0]: expected a token id (an integer >= 0), got [11]"),
        (["a", ""], 1, "prompt[1]: empty"),
        (["a", 3.5], 1, "prompt[1]: expected a string of text or a list of token ids, got 3.5"),
        ({"text": "a"}, 0, 'prompt: expected a string of text or a list of token ids, got {"text"'),
    ],
)  # fmt: skip
def test_a_wrong_prompt_is_named_where_it_is(prompt: Any, index: int, words: str) -> None:
    call = parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": prompt})
    with pytest.raises(InvalidInput) as caught:
        checked(call, index)
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


def test_n_samples_each_prompt_as_a_group_of_seeded_choices() -> None:
    call = parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": ["a", "b"], "n": 3, "seed": 7})
    assert call.n == 3
    assert [body["prompt"] for body in call.bodies] == ["a", "a", "a", "b", "b", "b"]
    seeds = [body["seed"] for body in call.bodies]
    assert seeds[0] == seeds[3] == 7  # choice 0 keeps the call's seed
    assert len(set(seeds[:3])) == 3  # the others draw their own...
    assert seeds[:3] == seeds[3:]  # ...derived from the seed and the choice alone
    again = parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": "a", "n": 2, "seed": 7})
    assert [body["seed"] for body in again.bodies] == seeds[:2]
    unseeded = parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": "a", "n": 2})
    assert all("seed" not in body for body in unseeded.bodies)
    error = InvalidInput("prompt: empty; give at least one character of text")
    listed = parse(Endpoint.COMPLETIONS, {"model": "m", "prompt": ["a", ""], "n": 2})
    assert listed.renamed(error, 3).message.startswith("prompt[1]:")
