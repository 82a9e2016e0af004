"""The OpenAI-compatible routes end to end, with the official ``openai`` client unchanged:
a TRL policy (the ``tiny_policies`` fixture) exported by ``rlserve export lm``, served by
a real server, asked through ``/v1/completions`` and ``/v1/chat/completions`` and checked
against the native ``/v1/models/{model}/generate`` route of the same server (which
``test_lm`` checks against transformers)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from tests.e2e.conftest import LM_MODEL
from tests.e2e.lm_busy import busy_decoding
from tests.e2e.server import Server

MODEL = LM_MODEL
PROMPTS = ["The cat", "The small dog sleeps in the garden and the", "What does the bird do?"]
NEW_TOKENS = [12, 24, 7]
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about the fox."}]
LONG_TOKENS, HOT = 250, 25.0  # long generations: EOS as rare as any other token


@pytest.fixture(scope="module")
def server(lm_server: Server) -> Server:
    return lm_server


@pytest.fixture(scope="module")
def client(openai_client: OpenAI) -> OpenAI:
    return openai_client


def generate(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    """The native route's answer to the same request."""
    answer = httpx.post(f"{server.url}/v1/models/{MODEL}/generate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_greedy_completions_are_the_native_greedy_answers(server: Server, client: OpenAI) -> None:
    for prompt, budget in zip(PROMPTS, NEW_TOKENS, strict=True):
        raw = client.completions.with_raw_response.create(
            model=MODEL, prompt=prompt, max_tokens=budget, temperature=0
        )
        completion = raw.parse()
        native = generate(server, {"prompt": prompt, "max_new_tokens": budget, "temperature": 0})
        (choice,) = completion.choices
        assert choice.text == native["text"]
        assert choice.finish_reason == native["finish_reason"]
        assert choice.index == 0
        assert completion.object == "text_completion"
        assert completion.model == MODEL
        assert completion.id.startswith("cmpl-")
        assert completion.usage is not None
        assert completion.usage.prompt_tokens == native["prompt_tokens"]
        assert completion.usage.completion_tokens == len(native["token_ids"])
        assert completion.usage.total_tokens == native["prompt_tokens"] + len(native["token_ids"])
        assert completion.system_fingerprint == f"rlserve-{MODEL}-v1"
        assert raw.headers["x-policy-version"] == "1"
        assert raw.headers["x-policy-sha256"] == native["model_sha256"]


def test_a_chat_completion_is_the_native_chat_answer(server: Server, client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_completion_tokens=24, temperature=0
    )
    chat = raw.parse()
    native = generate(server, {"messages": CHAT, "max_new_tokens": 24, "temperature": 0})
    (choice,) = chat.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == native["text"]
    assert choice.finish_reason == native["finish_reason"]
    assert chat.object == "chat.completion"
    assert chat.id.startswith("chatcmpl-")
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == native["prompt_tokens"]
    assert chat.usage.completion_tokens == len(native["token_ids"])
    assert chat.system_fingerprint == f"rlserve-{MODEL}-v1"
    assert raw.headers["x-policy-version"] == "1"
    # max_tokens, the former name, means the same
    former = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=24, temperature=0
    )
    assert former.choices[0].message.content == native["text"]


def test_a_text_part_list_is_the_same_message(client: OpenAI) -> None:
    parts: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": [{"type": "text", "text": "Tell me about the fox."}]}
    ]
    as_parts = client.chat.completions.create(
        model=MODEL, messages=parts, max_completion_tokens=10, temperature=0
    )
    as_text = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=10, temperature=0
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content


def test_streamed_completion_chunks_add_up_to_the_answer(client: OpenAI) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 30, "seed": 3}
    whole = client.completions.create(**body, temperature=0.8)
    chunks = list(
        client.completions.create(
            **body, temperature=0.8, stream=True, stream_options={"include_usage": True}
        )
    )
    *texts, last, counted = chunks
    assert len(texts) >= 2  # token by token, not at once
    assert "".join(c.choices[0].text for c in texts) == whole.choices[0].text
    assert all(c.choices[0].finish_reason is None for c in texts)
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert counted.choices == []
    assert counted.usage == whole.usage
    assert all(c.usage is None for c in texts)
    assert {c.id for c in chunks} == {chunks[0].id}
    assert {c.system_fingerprint for c in chunks} == {f"rlserve-{MODEL}-v1"}


def test_streamed_chat_chunks_add_up_to_the_answer(client: OpenAI) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": CHAT, "max_completion_tokens": 20}
    whole = client.chat.completions.create(**body, temperature=0)
    with client.chat.completions.with_streaming_response.create(
        **body, temperature=0, stream=True
    ) as raw:
        assert raw.headers["content-type"] == "text/event-stream"
        assert raw.headers["x-policy-version"] == "1"
        chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.usage is None for c in chunks)  # not asked for


def test_log_probs_are_those_of_the_chosen_tokens(server: Server, client: OpenAI) -> None:
    prompt, budget = PROMPTS[0], 16
    native = generate(server, {"prompt": prompt, "max_new_tokens": budget, "temperature": 0})
    completion = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=budget, temperature=0, logprobs=0
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.tokens is not None
    assert logprobs.text_offset is not None
    assert logprobs.token_logprobs == pytest.approx(native["log_probs"], abs=1e-12)
    stopped = native["finish_reason"] == "stop"  # on the EOS: named "</s>", adding no text
    assert logprobs.tokens[-1] == "</s>" if stopped else logprobs.tokens[-1] != "</s>"
    assert "".join(logprobs.tokens[:-1] if stopped else logprobs.tokens) == native["text"]
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset == sorted(logprobs.text_offset)

    chat_native = generate(server, {"messages": CHAT, "max_new_tokens": budget, "temperature": 0})
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=budget, temperature=0, logprobs=True
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    assert [t.logprob for t in content] == pytest.approx(chat_native["log_probs"], abs=1e-12)
    names = [t.token for t in content]
    stopped = chat_native["finish_reason"] == "stop"
    assert names[-1] == "</s>" if stopped else names[-1] != "</s>"
    assert "".join(names[:-1] if stopped else names) == chat_native["text"]
    assert all(t.top_logprobs == [] for t in content)
    assert all(bytes(t.bytes or []) == t.token.encode() for t in content)

    streamed = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_completion_tokens=budget,
        temperature=0,
        logprobs=True,
        stream=True,
    )
    tokens = [t for chunk in streamed for t in chunk_log_probs(chunk)]
    assert [t.logprob for t in tokens] == [t.logprob for t in content]
    assert [t.token for t in tokens] == [t.token for t in content]


def chunk_log_probs(chunk: ChatCompletionChunk) -> list[Any]:
    logprobs = chunk.choices[0].logprobs
    return [] if logprobs is None or logprobs.content is None else list(logprobs.content)


def test_a_seed_makes_a_sample_reproducible(server: Server, client: OpenAI) -> None:
    sampled: dict[str, Any] = {"model": MODEL, "prompt": "The cat", "max_tokens": 24}
    first = client.completions.create(**sampled, temperature=1.3, seed=7)
    again = client.completions.create(**sampled, temperature=1.3, seed=7)
    other = client.completions.create(**sampled, temperature=1.3, seed=8)
    native = generate(
        server, {"prompt": "The cat", "max_new_tokens": 24, "temperature": 1.3, "seed": 7}
    )
    assert first.choices[0].text == again.choices[0].text == native["text"]
    assert other.choices[0].text != first.choices[0].text


def test_stop_strings_end_the_text_as_natively(server: Server, client: OpenAI) -> None:
    prompt = PROMPTS[1]
    native = generate(server, {"prompt": prompt, "max_new_tokens": 40, "temperature": 0})
    stop = native["text"].strip().split(" ")[1]  # a word the answer holds
    stopped = generate(
        server, {"prompt": prompt, "max_new_tokens": 40, "temperature": 0, "stop": [stop]}
    )
    completion = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=[stop]
    )
    assert completion.choices[0].text == stopped["text"]
    assert stop not in completion.choices[0].text
    assert completion.choices[0].finish_reason == "stop"


def test_models_are_listed_for_openai_clients_and_for_rlserve(
    server: Server, client: OpenAI
) -> None:
    listed = client.models.list()
    assert [m.id for m in listed.data] == [MODEL]
    assert listed.data[0].owned_by == "rlserve"
    with server.client() as plain:
        native = plain.get("/v1/models").json()
    assert native["models"][0]["name"] == MODEL  # rlserve's own listing is still there


def error_body(error: openai.APIStatusError) -> dict[str, Any]:
    body = error.body
    assert isinstance(body, dict)
    assert set(body) == {"message", "type", "param", "code"}  # OpenAI's error shape
    return body


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"n": 0}, "n", ["n: expected an integer >= 1", "choices per prompt"]),
        ({"prompt": ""}, "prompt", ["prompt: empty"]),
        ({"prompt": "The cat " * 200}, "prompt", ["prompt: 601 tokens", "at most 255"]),
        ({"logprobs": 21}, "logprobs", ["an integer in [0, 20]", "got 21"]),
        ({"echo": True, "stream": True}, "echo", ["repeated only in a whole answer"]),
        ({"temperature": -1}, "temperature", ["temperature: expected a number >= 0"]),
        ({"presence_penalty": 0.5}, "presence_penalty", ["penalties are not supported"]),
    ],
)  # fmt: skip
def test_bad_completions_are_400_and_say_what_is_wrong(
    client: OpenAI, extra: dict[str, Any], param: str, words: list[str]
) -> None:
    body = {"model": MODEL, "prompt": "The", "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(**body)
    error = error_body(caught.value)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"]


def test_bad_chats_are_400_and_say_what_is_wrong(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=CHAT, top_logprobs=3)
    assert error_body(caught.value)["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=CHAT, logprobs=True, top_logprobs=21)
    assert error_body(caught.value)["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[])
    assert error_body(caught.value)["param"] == "messages"


def test_an_unknown_model_is_not_found(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="nope", prompt="The")
    error = error_body(caught.value)
    assert error["code"] == "model_not_found"
    assert "model 'nope'" in error["message"]
    assert MODEL in error["message"]  # it names the models there are


def test_a_tight_deadline_is_504(server: Server, client: OpenAI) -> None:
    with busy_decoding(server.url, MODEL), pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(  # beside the busy ones it cannot finish within 15 ms
            model=MODEL,
            prompt="The cat",
            max_tokens=LONG_TOKENS,
            temperature=HOT,
            seed=1,
            extra_headers={"X-Request-Timeout-Ms": "15"},
        )
    assert caught.value.status_code == 504
    assert error_body(caught.value)["code"] == "deadline_exceeded"


def test_a_deadline_that_passes_mid_stream_is_an_error_event(
    server: Server, client: OpenAI
) -> None:
    received: list[Any] = []
    with busy_decoding(server.url, MODEL):  # beside the busy ones it cannot finish in 60 ms
        stream = client.completions.create(
            model=MODEL,
            prompt="The",
            max_tokens=LONG_TOKENS,
            temperature=HOT,
            seed=3,
            stream=True,
            extra_headers={"X-Request-Timeout-Ms": "60"},
        )

        def read() -> None:
            for chunk in stream:
                received.append(chunk)

        with pytest.raises(openai.APIError) as caught:
            read()
    assert received  # it started in time
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "deadline_exceeded"


def test_the_openapi_document_lists_the_language_model_routes(server: Server) -> None:
    with server.client() as plain:
        spec = plain.get("/openapi.json").json()
    for path in (
        "/v1/models/{model}/generate",
        "/v1/models/{model}/versions/{version}/score",
        "/v1/completions",
        "/v1/chat/completions",
    ):
        assert "post" in spec["paths"][path], path
    schemas = spec["components"]["schemas"]
    assert "completions" in schemas["ScoreRequest"]["properties"]
    assert "messages" in schemas["ChatCompletionRequest"]["properties"]
    assert "language models" in spec["paths"]["/v1/models"]["get"]["description"]
