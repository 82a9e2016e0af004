"""Language-model policies end to end: a TRL policy (the ``tiny_policies`` fixture) exported
by ``rlserve export lm``, served by a real server, asked over HTTP, checked against
``transformers`` running the same checkpoint."""

from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import pytest

from serve.lm.requests import choice_seed
from tests.e2e.conftest import DEMO, LM_CONFIG, LM_MODEL, Exported, lm_repository
from tests.e2e.lm_busy import busy_decoding
from tests.e2e.server import Server

MODEL = LM_MODEL
# Uneven lengths, sent together: equal lengths would pass with a wrong mask or positions.
PROMPTS = [
    "The cat",
    "The small dog sleeps in the garden and the",
    "Tell me about the",
    "The sun",
    "The old horse waits by the barn in the evening and the bread",
    "What does the bird do? The bird",
    "The",
    "The train leaves at the station and the boat",
]
NEW_TOKENS = [12, 24, 7, 30, 16, 9, 20, 18]
# Long generations: a high temperature makes EOS as rare as any other token.
LONG = {"max_new_tokens": 160, "temperature": 25.0}


@pytest.fixture(scope="module")
def server(lm_server: Server) -> Server:
    return lm_server


@pytest.fixture(scope="module")
def reference(exported: Exported) -> Transformers:
    return Transformers(exported.sources[1])


class Transformers:
    """The source checkpoint in transformers: greedy generation and scores, in float64."""

    def __init__(self, checkpoint: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()

    def greedy(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
        with self.torch.no_grad():
            ids = self.torch.tensor([prompt_ids])
            out = self.model.generate(
                ids, attention_mask=self.torch.ones_like(ids), max_new_tokens=max_new_tokens,
                do_sample=False, pad_token_id=self.tokenizer.pad_token_id,
            )  # fmt: skip
        new = out[0, len(prompt_ids) :].tolist()
        return new, self.log_probs(prompt_ids, new)

    def log_probs(self, prompt_ids: list[int], completion: list[int]) -> list[float]:
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([prompt_ids + completion])).logits[0]
        table = self.torch.log_softmax(logits.double(), dim=-1)
        start = len(prompt_ids) - 1
        return [float(table[start + k, t]) for k, t in enumerate(completion)]

    def text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def generate(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/models/{MODEL}/generate", json=body, headers=headers, timeout=60)


def together(calls: list[Any]) -> list[Any]:
    """Every call at once: the threads start, then all make their calls together."""
    start = threading.Barrier(len(calls))

    def call(one: Any) -> Any:
        start.wait()
        return one()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(call, calls))


def test_greedy_answers_are_those_of_transformers_for_uneven_prompts_sent_together(
    server: Server, reference: Transformers
) -> None:
    bodies = [{"prompt": p, "max_new_tokens": n} for p, n in zip(PROMPTS, NEW_TOKENS, strict=True)]
    answers = together([lambda b=b: generate(server.url, b) for b in bodies])
    for prompt, budget, answer in zip(PROMPTS, NEW_TOKENS, answers, strict=True):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        prompt_ids = reference.tokenizer(prompt)["input_ids"]
        ids, log_probs = reference.greedy(prompt_ids, budget)
        assert body["token_ids"] == ids, prompt
        assert body["text"] == reference.text(ids)
        assert np.abs(np.asarray(body["log_probs"]) - log_probs).max() < 1e-4
        assert body["prompt_tokens"] == len(prompt_ids)
        assert body["finish_reason"] == ("stop" if ids[-1] == 1 else "length")
        assert answer.headers["x-policy-version"] == str(body["model_version"]) == "1"
        assert answer.headers["x-policy-sha256"] == body["model_sha256"]


def test_a_chat_is_rendered_as_transformers_renders_it(
    server: Server, reference: Transformers
) -> None:
    messages = [{"role": "user", "content": "Tell me about the fox."}]
    answer = generate(server.url, {"messages": messages, "max_new_tokens": 24}).json()
    rendered = reference.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    prompt_ids = list(cast(list[int], rendered))
    ids, _ = reference.greedy(prompt_ids, 24)
    assert answer["prompt_tokens"] == len(prompt_ids)
    assert answer["token_ids"] == ids
    assert answer["text"] == reference.text(ids)


def test_a_prompt_of_token_ids_is_the_prompt_they_encode(
    server: Server, reference: Transformers
) -> None:
    prompt_ids = reference.tokenizer(PROMPTS[1])["input_ids"]  # as clients tokenize
    as_text = generate(server.url, {"prompt": PROMPTS[1], "max_new_tokens": 20}).json()
    as_ids = generate(server.url, {"prompt": prompt_ids, "max_new_tokens": 20}).json()
    assert as_ids["token_ids"] == as_text["token_ids"]
    assert as_ids["text"] == as_text["text"]
    assert as_ids["prompt_tokens"] == as_text["prompt_tokens"] == len(prompt_ids)


def test_max_new_tokens_past_the_context_generates_up_to_it(server: Server) -> None:
    body = {"prompt": PROMPTS[1], "max_new_tokens": 400, "ignore_eos": True, "temperature": 0}
    answer = generate(server.url, body).json()
    assert answer["finish_reason"] == "length"
    assert answer["prompt_tokens"] + answer["completion_tokens"] == 256  # the context
    streamed = generate(server.url, {**body, "stream": True}).text.strip().split("\n\n")
    name, data = streamed[-1].split("\n")
    assert name == "event: result"
    assert json.loads(data.split(": ", 1)[1])["token_ids"] == answer["token_ids"]


def test_scores_are_those_of_transformers(server: Server, reference: Transformers) -> None:
    prompt = "Tell me about the cat."
    completions = [" The cat sleeps in the garden.", " Rain falls on the roof.", " The"]
    answer = httpx.post(
        f"{server.url}/v1/models/{MODEL}/score",
        json={"prompt": prompt, "completions": completions},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    prompt_ids = reference.tokenizer(prompt)["input_ids"]
    assert body["prompt_tokens"] == len(prompt_ids)
    assert answer.headers["x-policy-version"] == "1"
    for completion, scored in zip(completions, body["scores"], strict=True):
        ids = reference.tokenizer(completion, add_special_tokens=False)["input_ids"]
        expected = reference.log_probs(prompt_ids, ids)
        assert scored["token_ids"] == ids
        assert np.abs(np.asarray(scored["log_probs"]) - expected).max() < 1e-4
        assert scored["log_prob"] == pytest.approx(sum(expected), abs=1e-4)
        assert set(scored) == {"token_ids", "log_probs", "log_prob"}  # never whole logits


def test_a_seed_gives_the_same_sample_whatever_runs_beside_it(server: Server) -> None:
    sampled = {"prompt": "The cat", "max_new_tokens": 24, "temperature": 1.3, "seed": 7}
    alone = generate(server.url, sampled).json()["token_ids"]
    crowd = [{"prompt": p, "max_new_tokens": 24, "temperature": 1.3, "seed": i}
             for i, p in enumerate(PROMPTS)]  # fmt: skip
    answers = together(
        [lambda: generate(server.url, sampled)]
        + [lambda b=b: generate(server.url, b) for b in crowd]
    )
    assert answers[0].json()["token_ids"] == alone
    other = generate(server.url, {**sampled, "seed": 8}).json()["token_ids"]
    assert other != alone


def histogram(server: Server, client: httpx.Client, name: str) -> tuple[float, float]:
    """(observations in the le=1 bucket, all observations) of a model's histogram."""
    first = server.metric(client, f"{name}_bucket", model=MODEL, le="1.0")
    return first, server.metric(client, f"{name}_count", model=MODEL)


def test_concurrent_requests_share_decoding_steps(server: Server) -> None:
    with server.client() as client:
        single_before, steps_before = histogram(server, client, "rlserve_lm_step_sequences")
        tokens_before = server.metric(client, "rlserve_lm_generated_tokens_total", model=MODEL)
        # long enough to overlap on a busy machine (the requests start together)
        bodies = [{"prompt": p, "max_new_tokens": 64, "temperature": 25.0, "seed": i}
                  for i, p in enumerate(PROMPTS)]  # fmt: skip
        answers = together([lambda b=b: generate(server.url, b) for b in bodies])
        time.sleep(0.3)  # the metrics are moved from the steps' tallies a few times a second
        single, steps = histogram(server, client, "rlserve_lm_step_sequences")
        tokens = server.metric(client, "rlserve_lm_generated_tokens_total", model=MODEL)
        ttft = server.metric(client, "rlserve_lm_time_to_first_token_seconds_count", model=MODEL)
        inter = server.metric(client, "rlserve_lm_inter_token_latency_seconds_count", model=MODEL)
        assert server.metric(client, "rlserve_lm_kv_cache_bytes", model=MODEL) >= 0
    generated = sum(len(a.json()["token_ids"]) for a in answers)
    assert tokens - tokens_before == generated
    shared = (steps - steps_before) - (single - single_before)
    assert shared > 0  # steps that decoded more than one sequence
    assert steps - steps_before < generated  # fewer steps than tokens: they were shared
    assert ttft >= len(bodies)
    assert inter > 0


def test_a_late_request_joins_a_running_batch(server: Server) -> None:
    """With waves (static batching) the late request would wait for every running one to
    finish; with continuous batching it is answered while they go on."""
    arrived: dict[str, list[float]] = {}

    def stream(client: httpx.Client, name: str, body: dict[str, Any]) -> None:
        times = arrived[name] = []
        path = f"/v1/models/{MODEL}/generate"
        with client.stream("POST", path, json={**body, "stream": True}) as answer:
            for line in answer.iter_lines():
                if line.startswith("event: token"):
                    times.append(time.monotonic())

    clients = [httpx.Client(base_url=server.url, timeout=60) for _ in range(4)]
    for client in clients:
        client.get("/health")  # connected before the clock matters
    long = [
        threading.Thread(
            target=stream,
            args=(
                clients[i],
                f"long{i}",
                {"prompt": "The", **LONG, "max_new_tokens": 250, "seed": i},
            ),
        )
        for i in range(3)
    ]
    for thread in long:
        thread.start()
    deadline = time.monotonic() + 30
    while not all(arrived.get(f"long{i}") for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.001)
    stream(clients[3], "late", {"prompt": "The cat", "max_new_tokens": 3})
    for thread in long:
        thread.join()
    for client in clients:
        client.close()
    late_done = arrived["late"][-1]
    after_late = max(sum(1 for t in arrived[f"long{i}"] if t > late_done) for i in range(3))
    assert len(arrived["late"]) == 3
    assert after_late >= 20  # a running generation went on for many tokens after it
    assert late_done < max(arrived[f"long{i}"][-1] for i in range(3))


def test_n_samples_a_group_each_choice_reproducible_from_the_seed_and_its_index(
    server: Server,
) -> None:
    sampled = {"prompt": "The cat", "max_new_tokens": 16, "temperature": 1.3, "seed": 11}
    group = generate(server.url, {**sampled, "n": 4, "echo": True})
    assert group.status_code == 200, group.text
    answer = group.json()
    assert answer["model_version"] == 1
    assert group.headers["x-policy-version"] == "1"
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert len({tuple(c["token_ids"]) for c in choices}) > 1  # sampled apart
    assert answer["prompt_tokens"] == generate(server.url, sampled).json()["prompt_tokens"]
    assert answer["prompt"]["log_probs"][0] is None  # echoed once, for the whole group
    for index, choice in enumerate(choices):
        alone = generate(server.url, {**sampled, "seed": choice_seed(11, index)}).json()
        assert choice["token_ids"] == alone["token_ids"]
        assert choice["text"] == alone["text"]
        assert choice["log_probs"] == pytest.approx(alone["log_probs"], abs=1e-5)
        assert choice["completion_tokens"] == len(choice["token_ids"])
        assert "prompt" not in choice


def test_a_streamed_group_tags_each_token_with_its_choice(server: Server) -> None:
    body = {"prompt": "The small dog", "max_new_tokens": 8, "n": 3, "temperature": 1.0,
            "seed": 3, "stream": True}  # fmt: skip
    with httpx.stream(
        "POST", f"{server.url}/v1/models/{MODEL}/generate", json=body, timeout=30
    ) as answer:
        assert answer.status_code == 200
        events = [
            (event.split(": ", 1)[1], json.loads(data.split(": ", 1)[1]))
            for event, data in (
                block.split("\n") for block in answer.read().decode().strip().split("\n\n")
            )
        ]
    name, result = events[-1]
    assert name == "result"
    for choice in result["choices"]:
        tokens = [d for n, d in events if n == "token" and d["choice"] == choice["index"]]
        assert [t["token_id"] for t in tokens] == choice["token_ids"]
        assert [t["index"] for t in tokens] == list(range(len(tokens)))


def test_server_sent_events_carry_each_token_then_the_result(server: Server) -> None:
    with httpx.stream(
        "POST", f"{server.url}/v1/models/{MODEL}/generate",
        json={"prompt": "The small dog", "max_new_tokens": 14, "stream": True}, timeout=30,
    ) as answer:  # fmt: skip
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.headers["x-policy-version"] == "1"
        events = [
            (event.split(": ", 1)[1], json.loads(data.split(": ", 1)[1]))
            for event, data in (
                block.split("\n") for block in answer.read().decode().strip().split("\n\n")
            )
        ]
    tokens = [data for name, data in events if name == "token"]
    name, result = events[-1]
    assert name == "result"
    assert len(tokens) == len(events) - 1
    assert [t["token_id"] for t in tokens] == result["token_ids"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert "".join(t["text"] for t in tokens) == result["text"]
    assert [t["log_prob"] for t in tokens] == result["log_probs"]
    plain = generate(server.url, {"prompt": "The small dog", "max_new_tokens": 14}).json()
    assert plain["token_ids"] == result["token_ids"]


def test_predict_on_a_language_model_generates(server: Server) -> None:
    body = {"prompt": "The sun", "max_new_tokens": 10}
    via_predict = httpx.post(f"{server.url}/predict", json=body, timeout=30)
    assert via_predict.status_code == 200, via_predict.text
    assert via_predict.json()["token_ids"] == generate(server.url, body).json()["token_ids"]
    assert via_predict.headers["x-policy-version"] == "1"


def test_a_tight_deadline_is_answered_504(server: Server) -> None:
    with busy_decoding(server.url, MODEL):  # so it cannot finish within 15 ms
        answer = generate(
            server.url, {"prompt": "The cat", **LONG, "seed": 1}, **{"X-Request-Timeout-Ms": "15"}
        )
    assert answer.status_code == 504
    assert answer.json()["error"]["code"] == "deadline_exceeded"
    assert generate(server.url, {"prompt": "The cat", "max_new_tokens": 3}).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/models/nope/generate", {"prompt": "The"}, 404, ["model 'nope'", "llama"]),
        (f"/v1/models/{MODEL}/generate", {"prompt": ""}, 422, ["prompt: empty"]),
        (f"/v1/models/{MODEL}/generate", {"prompt": [1, 99999]}, 422,
         ["prompt[1]: token id 99999 is outside the vocabulary of model 'llama'", "ids are 0 to"]),
        (f"/v1/models/{MODEL}/generate", {"prompt": "The cat " * 200}, 422,
         ["prompt: 601 tokens, longer than", "context holds 256 tokens", "at most 255"]),
        (f"/v1/models/{MODEL}/generate", {"prompt": "The", "temperature": -1}, 422,
         ["temperature: expected a number >= 0", "-1"]),
        (f"/v1/models/{MODEL}/generate", {"prompt": "The", "top_p": 2}, 422, ["top_p", "(0, 1]"]),
        (f"/v1/models/{MODEL}/score", {"prompt": "The", "completions": []}, 422, ["completions"]),
        (f"/v1/models/{MODEL}/generate", {"prompt": "The", "stream": "yes"}, 422, ["stream"]),
        (f"/v1/models/{MODEL}/generate", {"prompt": "The", "n": 0}, 422,
         ["n: expected an integer in [1, 256], got 0"]),
        (f"/v1/models/{MODEL}/generate", {"prompt": "The", "n": 300}, 422, ["n:", "256"]),
    ],
)  # fmt: skip
def test_bad_requests_are_told_what_is_wrong(server, path, body, status, words) -> None:
    answer = httpx.post(server.url + path, json=body, timeout=30)
    assert answer.status_code == status
    message = answer.json()["error"]["message"]
    for word in words:
        assert word in message


def test_a_deadline_that_passes_mid_stream_ends_it_with_an_error_event(server: Server) -> None:
    with busy_decoding(server.url, MODEL), httpx.stream(  # it cannot finish within 60 ms
        "POST", f"{server.url}/v1/models/{MODEL}/generate",
        json={
            "prompt": "The", **LONG, "max_new_tokens": 250, "ignore_eos": True, "seed": 3,
            "stream": True,
        },  # all 250 tokens: a sampled end of sequence would end it early on a fast machine
        headers={"X-Request-Timeout-Ms": "60"}, timeout=30,
    ) as answer:  # fmt: skip
        assert answer.status_code == 200  # it started in time
        blocks = answer.read().decode().strip().split("\n\n")
    name, data = blocks[-1].split("\n")
    assert name == "event: error"
    assert json.loads(data.split(": ", 1)[1])["error"]["code"] == "deadline_exceeded"
    assert all(block.startswith("event: token") for block in blocks[:-1])


def test_a_full_queue_is_answered_429_with_retry_after(exported: Exported, tmp_path: Path) -> None:
    repo = lm_repository(exported, tmp_path, 1)
    (repo / MODEL / "config.yaml").write_text(LM_CONFIG + "max_queue_rows: 1\nmax_sequences: 1\n")
    server = Server.rlserve(repo, log=tmp_path / "log")
    try:
        server.wait_ready()
        body = {"prompt": "The", **LONG, "max_new_tokens": 250}
        answers = together(
            [lambda seed=seed: generate(server.url, {**body, "seed": seed}) for seed in range(6)]
        )
    finally:
        server.stop()
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(200) >= 2  # one decoding, one queued behind it
    refused = [a for a in answers if a.status_code == 429]
    assert refused
    for answer in refused:
        assert int(answer.headers["retry-after"]) >= 1
        assert "queue full" in answer.json()["error"]["message"]


def test_the_model_describes_its_scheduler(server: Server) -> None:
    with server.client() as client:
        described = client.get(f"/v1/models/{MODEL}").json()
    assert described["scheduler"]["scheduler"] == "continuous_batcher"
    assert described["versions"][0]["kind"] == "causal-lm"


TOKEN = "lm-admin-token-0123456789"


def test_a_new_version_under_load_takes_over_and_every_answer_is_stamped(
    exported: Exported, tmp_path: Path
) -> None:
    repo = lm_repository(exported, tmp_path, 1)
    server = Server.rlserve(
        repo, "--poll-interval-s", "0.1", env={"RLSERVE_ADMIN_TOKEN": TOKEN}, log=tmp_path / "log"
    )
    answers: list[tuple[int, str, dict[str, Any]]] = []
    stop = threading.Event()

    def load(index: int) -> None:
        body = {"prompt": PROMPTS[index], "max_new_tokens": NEW_TOKENS[index]}
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                answer = client.post(f"{server.url}/v1/models/{MODEL}/generate", json=body)
                answers.append((index, answer.headers.get("x-policy-version", ""), answer.json()))

    def versions_seen() -> set[int]:
        return {body.get("model_version", 0) for _, _, body in list(answers)}

    try:
        server.wait_ready()
        workers = [threading.Thread(target=load, args=(i,)) for i in range(4)]
        for worker in workers:
            worker.start()
        time.sleep(0.3)
        incoming = repo / MODEL / ".incoming-2"
        shutil.copytree(exported.versions / MODEL / "2", incoming)
        incoming.rename(repo / MODEL / "2")  # appears whole: the watcher pulls it
        server.wait_until(lambda _: 2 in versions_seen(), 30, "answering from version 2")
        seen_before_rollback = len(answers)
        with httpx.Client(base_url=server.url, timeout=30) as admin:
            rolled = admin.post(
                f"/v1/models/{MODEL}/versions/1/activate",
                params={"rollback": "true"},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
        assert rolled.status_code == 200, rolled.text
        server.wait_until(
            lambda _: any(
                b.get("model_version") == 1 for _, _, b in answers[seen_before_rollback:]
            ),
            30,
            "answering from version 1 again",
        )
        time.sleep(0.2)
        stop.set()
        for worker in workers:
            worker.join()
        expected = {
            (index, version): generate_pinned(server.url, index, version)
            for index in range(4)
            for version in (1, 2)
        }
    finally:
        stop.set()
        server.stop()
    assert len(answers) > 20
    for index, header, body in answers:
        assert "error" not in body, body
        assert header == str(body["model_version"])
        assert body["token_ids"] == expected[(index, body["model_version"])]
    assert versions_seen() == {1, 2}


def generate_pinned(url: str, index: int, version: int) -> list[int]:
    body = {"prompt": PROMPTS[index], "max_new_tokens": NEW_TOKENS[index]}
    answer = httpx.post(f"{url}/v1/models/{MODEL}/versions/{version}/generate", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_version"] == version
    return list(answer.json()["token_ids"])


def test_generations_in_flight_are_finished_before_the_server_stops(
    exported: Exported, tmp_path: Path
) -> None:
    """SIGINT while six generations decode (each has streamed its first token): every one
    streams all its tokens and its result before the server exits."""
    server = Server.rlserve(lm_repository(exported, tmp_path, 1), log=tmp_path / "log")
    server.wait_ready()
    decoding = [threading.Event() for _ in range(6)]
    streamed: dict[int, tuple[int, int, str]] = {}  # seed: status, tokens, last event

    def ask(seed: int) -> None:
        body = {"prompt": "The", "max_new_tokens": 240, "temperature": 25.0, "seed": seed,
                "ignore_eos": True, "stream": True}  # fmt: skip
        tokens, last = 0, ""
        path = f"{server.url}/v1/models/{MODEL}/generate"
        try:
            with httpx.stream("POST", path, json=body, timeout=60) as answer:
                for line in answer.iter_lines():
                    if line.startswith("event: "):
                        last = line
                    if line == "event: token":
                        tokens += 1
                        decoding[seed].set()
            streamed[seed] = (answer.status_code, tokens, last)
        finally:
            decoding[seed].set()

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for event in decoding:
        assert event.wait(30), "a generation never started"
    server.stop(timeout_s=60)  # SIGINT: stop accepting, finish what is in flight
    for thread in threads:
        thread.join()
    assert streamed == {seed: (200, 240, "event: result") for seed in range(6)}


def test_a_version_of_the_other_kind_is_refused_and_the_model_still_serves(
    exported: Exported, tmp_path: Path
) -> None:
    repo = tmp_path / "repository"
    policy = next(p for p in sorted(DEMO.iterdir()) if (p / "model.onnx").is_file())
    shutil.copytree(policy, repo / "mixed" / "1")  # an actor-critic policy
    shutil.copytree(exported.versions / MODEL / "1", repo / "mixed" / "2")  # the newest decides
    (repo / "mixed" / "config.yaml").write_text("version_policy:\n  latest: 2\n")
    server = Server.rlserve(repo, log=tmp_path / "log")
    try:
        server.wait_ready()
        with server.client() as client:
            described = client.get("/v1/models/mixed").json()
            answer = client.post("/v1/models/mixed/generate", json={"prompt": "The cat"})
    finally:
        server.stop()
    assert described["active_version"] == 2
    assert described["scheduler"]["scheduler"] == "continuous_batcher"
    (failed,) = described["failed_versions"]
    assert failed["version"] == 1
    assert "this version is a policy" in failed["reason"]
    assert "language model" in failed["reason"]
    assert answer.status_code == 200
