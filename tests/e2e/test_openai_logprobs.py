"""Log-probs as evaluation clients ask for them, end to end with the official ``openai``
client on a real server serving the tiny TRL policy: the likeliest alternatives of each
token (completions' ``logprobs: k``, chat's ``top_logprobs``) and the prompt echoed and
scored (``echo``), as lm-evaluation-harness's loglikelihood request sends it, checked
against the source checkpoint in transformers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.e2e.conftest import LM_MODEL, Exported
from tests.e2e.server import Server
from tests.e2e.test_lm import Transformers

MODEL = LM_MODEL
CONTEXT = "The small dog sleeps in the garden and"
CONTINUATION = " the cat"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def server(lm_server: Server) -> Server:
    return lm_server


@pytest.fixture(scope="module")
def client(openai_client: OpenAI) -> OpenAI:
    return openai_client


@pytest.fixture(scope="module")
def reference(exported: Exported) -> Transformers:
    return Transformers(exported.sources[1])


def table(reference: Transformers, ids: list[int]) -> Any:
    """log p(token | the ids before each position), ``[len(ids), vocab]`` in float64."""
    torch = reference.torch
    with torch.no_grad():
        logits = reference.model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)


def likeliest(reference: Transformers, row: Any, k: int) -> list[tuple[str, float]]:
    values, tokens = row.topk(k)
    decode = reference.tokenizer.decode
    return [(str(decode([int(t)])), float(v)) for t, v in zip(tokens, values, strict=True)]


def test_a_loglikelihood_request_scores_the_echoed_prompt_as_transformers_does(
    client: OpenAI, reference: Transformers
) -> None:
    """lm-evaluation-harness's request: token ids of context + continuation, echo, one new
    token, the likeliest alternative of each position; it sums the continuation's log-probs
    and calls it greedy when each equals the likeliest."""
    context = reference.tokenizer(CONTEXT)["input_ids"]
    ids = context + reference.tokenizer(CONTINUATION, add_special_tokens=False)["input_ids"]
    answer = client.completions.create(
        model=MODEL, prompt=ids, echo=True, max_tokens=1, temperature=0, logprobs=1
    )
    choice = answer.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    assert logprobs.text_offset is not None
    assert len(logprobs.tokens) == len(ids) + 1  # the prompt, then the new token
    assert logprobs.tokens[0] == "<s>"  # a special token adds no text: named by its own
    assert choice.text == "".join(logprobs.tokens[1:])
    assert choice.text.startswith(reference.text(ids))
    assert logprobs.token_logprobs[0] is None
    assert logprobs.top_logprobs[0] is None
    scores = table(reference, ids)
    expected = [float(scores[p, ids[p + 1]]) for p in range(len(ids) - 1)]
    assert logprobs.token_logprobs[1 : len(ids)] == pytest.approx(expected, abs=TOLERANCE)
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    for position in range(1, len(ids)):  # lm-eval's greedy check, against transformers'
        top = logprobs.top_logprobs[position]
        assert len(top) == 1
        token_logprob = logprobs.token_logprobs[position]
        transformers_greedy = int(scores[position - 1].argmax()) == ids[position]
        assert (token_logprob == max(top.values())) == transformers_greedy
        ((text, value),) = likeliest(reference, scores[position - 1], 1)
        assert top[text] == pytest.approx(value, abs=TOLERANCE)


def test_each_new_tokens_likeliest_alternatives_are_those_of_transformers(
    client: OpenAI, reference: Transformers
) -> None:
    prompt = reference.tokenizer(CONTEXT)["input_ids"]
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=5, echo=False
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.top_logprobs is not None
    assert logprobs.token_logprobs is not None
    new, _ = reference.greedy(prompt, 6)
    scores = table(reference, prompt + new)
    for k, top in enumerate(logprobs.top_logprobs):
        expected = likeliest(reference, scores[len(prompt) - 1 + k], 5)
        assert list(top.values()) == pytest.approx([v for _, v in expected], abs=TOLERANCE)
        assert set(top) == {text for text, _ in expected}
        assert logprobs.token_logprobs[k] == max(top.values())  # greedy: the likeliest


def test_chat_alternatives_come_with_each_token_likeliest_first(client: OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "What does the cat do?"}]
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=6, temperature=0,
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content
    for token in content:
        values = [alternative.logprob for alternative in token.top_logprobs]
        assert len(values) == 3
        assert values == sorted(values, reverse=True)
        assert token.logprob == values[0]
        first = token.top_logprobs[0]
        assert first.bytes == list(first.token.encode())


def test_streamed_chunks_carry_their_tokens_alternatives(client: OpenAI) -> None:
    fields: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "logprobs": 2}
    whole = client.completions.create(model=MODEL, prompt=CONTEXT, **fields)
    streamed = client.completions.create(model=MODEL, prompt=CONTEXT, stream=True, **fields)
    tops: list[dict[str, float]] = []
    for chunk in streamed:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tops += chunk.choices[0].logprobs.top_logprobs or []
    assert whole.choices[0].logprobs is not None
    assert tops == whole.choices[0].logprobs.top_logprobs


def test_native_generate_gives_the_alternatives_and_prompt_scores_of_completions(
    server: Server, client: OpenAI, reference: Transformers
) -> None:
    prompt = reference.tokenizer(CONTEXT)["input_ids"]
    body = {"prompt": prompt, "max_new_tokens": 4, "temperature": 0, "top_logprobs": 3}
    native = httpx.post(
        f"{server.url}/v1/models/{MODEL}/generate", json={**body, "echo": True}, timeout=60
    ).json()
    openai_answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=3, echo=True
    )
    logprobs = openai_answer.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    assert native["prompt"]["token_ids"] == prompt
    assert native["prompt"]["log_probs"] + native["log_probs"] == logprobs.token_logprobs
    native_tops = native["prompt"]["top_log_probs"][1:] + native["top_log_probs"]
    assert [{a["text"]: a["log_prob"] for a in top} for top in native_tops] == (
        logprobs.top_logprobs[1:]
    )
    assert all(len(top) == 3 for top in native["top_log_probs"])
    streamed = httpx.post(
        f"{server.url}/v1/models/{MODEL}/generate", json={**body, "stream": True}, timeout=60
    ).text
    events = [
        json.loads(line.removeprefix("data: "))
        for line in streamed.splitlines()
        if line.startswith("data: ") and '"index"' in line
    ]
    assert [event["top_log_probs"] for event in events] == native["top_log_probs"]


def test_score_gives_each_scored_tokens_alternatives(
    server: Server, reference: Transformers
) -> None:
    body = {"prompt": CONTEXT, "completions": [CONTINUATION], "top_logprobs": 3}
    answer = httpx.post(f"{server.url}/v1/models/{MODEL}/score", json=body, timeout=60).json()
    (score,) = answer["scores"]
    prompt = reference.tokenizer(CONTEXT)["input_ids"]
    completion = score["token_ids"]
    scores = table(reference, prompt + completion)
    start = len(prompt) - 1
    expected = [float(scores[start + k, token]) for k, token in enumerate(completion)]
    assert score["log_probs"] == pytest.approx(expected, abs=TOLERANCE)
    assert len(score["top_log_probs"]) == len(completion)
    for k, top in enumerate(score["top_log_probs"]):
        likely = likeliest(reference, scores[start + k], 3)
        assert [a["log_prob"] for a in top] == pytest.approx([v for _, v in likely], abs=TOLERANCE)
        assert {a["text"] for a in top} == {text for text, _ in likely}
    plain = httpx.post(
        f"{server.url}/v1/models/{MODEL}/score",
        json={"prompt": CONTEXT, "completions": [CONTINUATION]},
        timeout=60,
    ).json()
    assert "top_log_probs" not in plain["scores"][0]
    assert plain["scores"][0]["log_probs"] == pytest.approx(score["log_probs"], abs=1e-12)


def test_tokens_named_by_their_ids_are_the_generated_ids(server: Server, client: OpenAI) -> None:
    """vLLM's return_tokens_as_token_ids: an RL client's exact ids (an EOS too, whose text
    is empty), the text and its offsets unchanged."""
    native = httpx.post(
        f"{server.url}/v1/models/{MODEL}/generate",
        json={"prompt": CONTEXT, "max_new_tokens": 40, "temperature": 0, "top_logprobs": 2},
        timeout=60,
    ).json()
    fields: dict[str, Any] = {"max_tokens": 40, "temperature": 0, "logprobs": 2}
    named = client.completions.create(
        model=MODEL, prompt=CONTEXT, extra_body={"return_tokens_as_token_ids": True}, **fields
    )
    logprobs = named.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.top_logprobs is not None
    assert logprobs.tokens == [f"token_id:{token}" for token in native["token_ids"]]
    assert [list(top) for top in logprobs.top_logprobs] == [
        [f"token_id:{a['token_id']}" for a in top] for top in native["top_log_probs"]
    ]
    by_text = client.completions.create(model=MODEL, prompt=CONTEXT, **fields)
    assert by_text.choices[0].logprobs is not None
    assert logprobs.text_offset == by_text.choices[0].logprobs.text_offset
    assert named.choices[0].text == by_text.choices[0].text
    messages: Any = [{"role": "user", "content": CONTEXT}]
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=6, temperature=0, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True},
    )  # fmt: skip
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content
    assert all(token.token.startswith("token_id:") for token in content)


def test_n_samples_a_group_with_its_prompt_prefilled_once(server: Server, client: OpenAI) -> None:
    """GRPO's group: n choices of one prompt, reproducible from the seed, the prompt's
    tokens prefilled and counted once."""
    fields: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0, "seed": 3, "logprobs": 0}
    with httpx.Client(base_url=server.url) as metrics:
        before = server.metric(metrics, "rlserve_lm_prompt_tokens_total", model=MODEL)
        group = client.completions.create(model=MODEL, prompt=CONTEXT, n=6, **fields)
        after = server.metric(metrics, "rlserve_lm_prompt_tokens_total", model=MODEL)
    again = client.completions.create(model=MODEL, prompt=CONTEXT, n=6, **fields)
    alone = client.completions.create(model=MODEL, prompt=CONTEXT, **fields)
    assert [choice.index for choice in group.choices] == list(range(6))
    texts = [choice.text for choice in group.choices]
    assert texts == [choice.text for choice in again.choices]  # reproducible from the seed
    assert texts[0] == alone.choices[0].text  # choice 0 draws from the seed itself
    assert len(set(texts)) > 1  # the others from seeds of their own
    assert group.usage is not None
    assert alone.usage is not None
    assert group.usage.prompt_tokens == alone.usage.prompt_tokens  # counted once
    lengths = [len(c.logprobs.tokens or []) for c in group.choices if c.logprobs]
    assert group.usage.completion_tokens == sum(lengths)
    assert after - before == alone.usage.prompt_tokens  # prefilled once for the group
    greedy = client.completions.create(
        model=MODEL, prompt=CONTEXT, n=3, max_tokens=8, temperature=0
    )
    assert len({choice.text for choice in greedy.choices}) == 1
