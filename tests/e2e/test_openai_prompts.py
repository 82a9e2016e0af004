"""Prompts as OpenAI clients send them, end to end with the official ``openai`` client: token
ids (as lm-evaluation-harness sends them, tokenized by the checkpoint's own tokenizer), several
prompts in one completions call, and a ``max_tokens`` past the context, on a real server
serving the tiny TRL policy (``tiny_policies``) exported by ``rlserve export lm``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types import Completion

from tests.e2e.conftest import LM_MODEL, Exported, lm_repository
from tests.e2e.lm_busy import busy_decoding
from tests.e2e.server import Server

MODEL = LM_MODEL
PROMPTS = ["The cat", "The small dog sleeps in the garden and the", "What does the bird do?"]
CONTEXT = 256  # the tiny policy's max_position_embeddings


@pytest.fixture(scope="module")
def server(lm_server: Server) -> Server:
    return lm_server


@pytest.fixture(scope="module")
def client(openai_client: OpenAI) -> OpenAI:
    return openai_client


@pytest.fixture(scope="module")
def token_ids(exported: Exported) -> dict[str, list[int]]:
    """Each prompt's ids from the checkpoint's tokenizer, as lm-evaluation-harness's
    huggingface tokenizer backend makes them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported.sources[1])
    return {prompt: list(tokenizer(prompt)["input_ids"]) for prompt in PROMPTS}


def complete(client: OpenAI, prompt: Any, **fields: Any) -> Completion:
    return client.completions.create(model=MODEL, prompt=prompt, **fields)


def test_a_prompt_of_token_ids_completes_as_its_text(
    client: OpenAI, token_ids: dict[str, list[int]]
) -> None:
    for prompt in PROMPTS:
        as_text = complete(client, prompt, max_tokens=16, temperature=0, logprobs=0)
        as_ids = complete(client, token_ids[prompt], max_tokens=16, temperature=0, logprobs=0)
        assert as_ids.choices[0].text == as_text.choices[0].text
        assert as_ids.choices[0].finish_reason == as_text.choices[0].finish_reason
        assert as_ids.choices[0].logprobs == as_text.choices[0].logprobs
        assert as_ids.usage == as_text.usage
        assert as_ids.usage is not None
        assert as_ids.usage.prompt_tokens == len(token_ids[prompt])


def test_several_prompts_in_one_call_are_the_choices_of_separate_calls_in_order(
    client: OpenAI, token_ids: dict[str, list[int]]
) -> None:
    fields: dict[str, Any] = {"max_tokens": 12, "temperature": 0, "logprobs": 0}
    alone = [complete(client, prompt, **fields) for prompt in PROMPTS]
    as_texts = complete(client, PROMPTS, **fields)
    as_ids = complete(client, [token_ids[p] for p in PROMPTS], **fields)
    for together in (as_texts, as_ids):
        assert [c.index for c in together.choices] == [0, 1, 2]
        assert [c.text for c in together.choices] == [a.choices[0].text for a in alone]
        assert [c.logprobs for c in together.choices] == [a.choices[0].logprobs for a in alone]
        assert [c.finish_reason for c in together.choices] == [
            a.choices[0].finish_reason for a in alone
        ]
        assert together.usage is not None
        for count in ("prompt_tokens", "completion_tokens", "total_tokens"):
            summed = sum(getattr(a.usage, count) for a in alone)
            assert getattr(together.usage, count) == summed, count
        assert together.system_fingerprint == f"rlserve-{MODEL}-v1"
    # a seeded sample of each prompt is the sample its own call gives
    sampled: dict[str, Any] = {"max_tokens": 20, "temperature": 1.3, "seed": 5}
    one_by_one = [complete(client, prompt, **sampled).choices[0].text for prompt in PROMPTS]
    assert [c.text for c in complete(client, PROMPTS, **sampled).choices] == one_by_one


def test_several_prompts_stream_their_choices_tagged_with_their_index(client: OpenAI) -> None:
    fields: dict[str, Any] = {"max_tokens": 20, "temperature": 0}
    whole = complete(client, PROMPTS, **fields)
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPTS, **fields, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    *texts, counted = chunks
    assert counted.choices == []
    assert counted.usage == whole.usage
    assert all(len(c.choices) == 1 for c in texts)
    for choice in whole.choices:
        own = [c.choices[0] for c in texts if c.choices[0].index == choice.index]
        assert "".join(c.text for c in own) == choice.text
        assert [c.finish_reason for c in own][-1] == choice.finish_reason
        assert all(c.finish_reason is None for c in own[:-1])
    assert {c.choices[0].index for c in texts} == {0, 1, 2}
    assert {c.id for c in chunks} == {chunks[0].id}
    # with log-probs: each choice's tokens and offsets are its own
    logged = complete(client, PROMPTS, **fields, logprobs=0)
    streamed = list(
        client.completions.create(model=MODEL, prompt=PROMPTS, **fields, logprobs=0, stream=True)
    )
    for choice in logged.choices:
        assert choice.logprobs is not None
        own = [c.choices[0].logprobs for c in streamed if c.choices[0].index == choice.index]
        tokens = [t for lp in own if lp is not None for t in lp.tokens or []]
        offsets = [o for lp in own if lp is not None for o in lp.text_offset or []]
        assert tokens == choice.logprobs.tokens
        assert offsets == choice.logprobs.text_offset


def test_max_tokens_past_the_context_stops_at_it_with_finish_reason_length(
    client: OpenAI,
) -> None:
    budget: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
    completion = complete(client, PROMPTS[1], max_tokens=400, **budget)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.total_tokens == CONTEXT
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about the fox."}],
        max_completion_tokens=400,
        **budget,
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert chat.usage.total_tokens == CONTEXT
    # without ignore_eos it stops where it stops, within the context
    plain = complete(client, PROMPTS[0], max_tokens=1000, temperature=0)
    assert plain.usage is not None
    assert plain.usage.total_tokens <= CONTEXT


def test_a_deadline_that_passes_while_several_prompts_stream_is_an_error_event(
    server: Server, client: OpenAI
) -> None:
    received: list[Any] = []
    with busy_decoding(server.url, MODEL):  # beside the busy ones they cannot finish in 60 ms
        stream = client.completions.create(
            model=MODEL,
            prompt=PROMPTS,
            max_tokens=240,
            temperature=25.0,  # EOS as rare as any other token
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
    described = httpx.get(f"{server.url}/v1/models/{MODEL}", timeout=30).json()
    assert described["scheduler"]["queued_requests"] == 0
    assert len(complete(client, PROMPTS, max_tokens=3).choices) == 3  # and it still serves


def test_a_call_of_more_prompts_than_the_queue_holds_is_400_naming_the_setting(
    exported: Exported, tmp_path: Path
) -> None:
    repository = lm_repository(exported, tmp_path, 1)
    config = repository / MODEL / "config.yaml"
    config.write_text(config.read_text() + "max_queue_rows: 2\n")
    small = Server.rlserve(repository, log=tmp_path / "log")
    small.wait_ready()
    try:
        with OpenAI(base_url=f"{small.url}/v1", api_key="unused", max_retries=0) as queued:
            assert len(complete(queued, PROMPTS[:2], max_tokens=3).choices) == 2
            with pytest.raises(openai.BadRequestError) as caught:
                complete(queued, PROMPTS, max_tokens=3)
    finally:
        small.stop()
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["param"] == "prompt"
    assert "3 prompts given; model 'llama' queues at most 2 requests" in body["message"]
    assert "max_queue_rows" in body["message"]


def vocabulary(server: Server) -> int:
    described = httpx.get(f"{server.url}/v1/models/{MODEL}", timeout=30).json()
    return int(described["versions"][0]["contract"]["vocab_size"])


def test_bad_prompts_are_400_and_say_what_is_wrong(server: Server, client: OpenAI) -> None:
    size = vocabulary(server)
    cases: list[tuple[Any, str, list[str]]] = [
        ([1, size], "prompt[1]",
         [f"prompt[1]: token id {size} is outside the vocabulary of model 'llama'",
          f"its ids are 0 to {size - 1}"]),
        ([[1, 2], [3, size + 5]], "prompt[1][1]", [f"prompt[1][1]: token id {size + 5}"]),
        ([1, -2], "prompt[1]", ["prompt[1]: expected a token id (an integer >= 0), got -2"]),
        ([], "prompt", ["prompt: an empty list"]),
        ([[1, 2], []], "prompt[1]", ["prompt[1]: an empty list of token ids"]),
        (["The", ""], "prompt[1]", ["prompt[1]: empty"]),
        (["The"] * 257, "prompt", ["257 prompts given", "at most 256 prompts per call"]),
        ("The cat " * 200, "prompt", ["prompt: 601 tokens", "at most 255"]),
        (["The", "The cat " * 200], "prompt[1]", ["prompt[1]: 601 tokens", "at most 255"]),
        ([5] * CONTEXT, "prompt", [f"prompt: {CONTEXT} tokens", "at most 255"]),
    ]  # fmt: skip
    for prompt, param, words in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            complete(client, prompt, max_tokens=4)
        body = caught.value.body
        assert isinstance(body, dict)
        assert body["param"] == param, body
        for word in words:
            assert word in body["message"], body
