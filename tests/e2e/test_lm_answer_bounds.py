"""A language model's answers are bounded (``max_answer_tokens``): a small request that asks
for a huge answer (many choices, every token with 20 alternatives, the context's length) is
refused before it queues, naming the product, on every route; the largest answer within the
bound is built and encoded off the event loop, so the server's other clients (``/health``,
a policy's ``/predict``) are answered meanwhile.

The probes' latencies while the largest answer is made are printed (``pytest -s``) and
recorded in docs/benchmarks.md; the test asserts only that every probe was answered."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import DEMO, LM_MODEL, Exported, lm_repository
from tests.e2e.server import Server

BOUND = 65536  # max_answer_tokens' default
CONTEXT = 256  # the tiny policies' context
# The request: ~170 bytes that asked for a 96 MiB answer.
WORST = {"n": 256, "logprobs": True, "top_logprobs": 20, "ignore_eos": True,
         "max_tokens": 100000, "temperature": 2}  # fmt: skip
# Near the largest that fits: 12 choices x at most 250 tokens x (1 + 20 alternatives).
LARGEST = {"n": 12, "logprobs": True, "top_logprobs": 20, "ignore_eos": True,
           "max_tokens": 250, "temperature": 2, "seed": 1}  # fmt: skip
COMPLETION = {k: v for k, v in WORST.items() if k != "top_logprobs"} | {"logprobs": 5}
CHAT = [{"role": "user", "content": "Tell me about the fox."}]


@pytest.fixture(scope="module")
def server(exported: Exported, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The language model and the demo policy, served together."""
    tmp = tmp_path_factory.mktemp("lm-bounds")
    repository = lm_repository(exported, tmp, 1)
    (repository / "cartpole").symlink_to(DEMO)
    running = Server.rlserve(repository, log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_the_worst_request_is_refused_naming_the_product(server: Server) -> None:
    chat = post(server, "/v1/chat/completions", {"model": LM_MODEL, "messages": CHAT, **WORST})
    assert chat.status_code == 400, chat.text
    message = chat.json()["error"]["message"]
    assert "max_answer_tokens" in message
    assert f"at most {BOUND}" in message
    assert "256 generation(s)" in message
    assert "1 + 20 top_logprobs" in message
    completion = post(
        server,
        "/v1/completions",
        {"model": LM_MODEL, "prompt": "The cat", "echo": True, **COMPLETION},
    )
    assert completion.status_code == 400, completion.text
    assert "max_answer_tokens" in completion.json()["error"]["message"]
    native = post(
        server,
        f"/v1/models/{LM_MODEL}/generate",
        {"prompt": "The cat", "n": 256, "top_logprobs": 20, "max_new_tokens": 100000,
         "ignore_eos": True, "echo": True},
    )  # fmt: skip
    assert (native.status_code, native.json()["error"]["code"]) == (422, "invalid_input")
    assert "max_answer_tokens" in native.json()["error"]["message"]
    score = post(
        server,
        f"/v1/models/{LM_MODEL}/score",
        {"prompt": "The", "completions": [" the cat sat on the mat" * 12] * 64, "top_logprobs": 20},
    )
    assert score.status_code == 422, score.text
    assert "completion(s)" in score.json()["error"]["message"]
    assert "max_answer_tokens" in score.json()["error"]["message"]
    with server.client() as http:  # nothing of them was queued
        assert http.get("/health").status_code == 200
        scheduler = http.get(f"/v1/models/{LM_MODEL}").json()["scheduler"]
        assert scheduler["max_answer_tokens"] == BOUND
        assert scheduler["queued_requests"] == 0


def test_the_largest_answer_leaves_the_other_clients_served(server: Server, tmp_path: Path) -> None:
    stop = threading.Event()
    latencies: dict[str, list[float]] = {"health": [], "predict": []}
    failures: list[str] = []

    def probe(kind: str) -> None:
        path = "/health" if kind == "health" else "/v1/models/cartpole/predict"
        body = {"observations": [0.01, -0.02, 0.03, 0.04]}
        with server.client() as http:
            while not stop.is_set():
                started = time.perf_counter()
                answer = http.get(path) if kind == "health" else http.post(path, json=body)
                latencies[kind].append(time.perf_counter() - started)
                if answer.status_code != 200:
                    failures.append(f"{kind}: {answer.status_code} {answer.text}")

    probes = [threading.Thread(target=probe, args=(kind,)) for kind in latencies]
    for thread in probes:
        thread.start()
    try:
        started = time.perf_counter()
        answer = post(
            server, "/v1/chat/completions", {"model": LM_MODEL, "messages": CHAT, **LARGEST}
        )
        took = time.perf_counter() - started
    finally:
        stop.set()
        for thread in probes:
            thread.join()
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert len(choices) == 12
    prompt = answer.json()["usage"]["prompt_tokens"]
    for choice in choices:  # ignore_eos: every choice fills the context
        content = choice["logprobs"]["content"]
        assert len(content) == CONTEXT - prompt
        assert all(len(token["top_logprobs"]) == 20 for token in content)
    assert failures == []
    assert all(latencies.values())
    shown = ", ".join(
        f"{kind} p50 {np.percentile(seen, 50) * 1e3:.1f} ms, p99 "
        f"{np.percentile(seen, 99) * 1e3:.1f} ms, max {max(seen) * 1e3:.1f} ms ({len(seen)} calls)"
        for kind, seen in latencies.items()
    )
    print(f"\nlargest answer ({len(answer.content) / 2**20:.1f} MiB) in {took:.2f} s; {shown}")
