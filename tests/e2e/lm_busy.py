"""Load for the language-model deadline tests: long generations decoding beside the request
a test times, so every decoding step has several more rows and that request takes several
times longer than it would alone. A deadline meant to pass in the middle of a generation
then keeps its margin however fast one step of the model gets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

STREAMS = 8
NEW_TOKENS = 240  # exactly (ignore_eos): the tiny policies' context holds 256 tokens
STARTED_S = 30.0


@contextmanager
def busy_decoding(url: str, model: str, streams: int = STREAMS) -> Iterator[None]:
    """``streams`` greedy generations of exactly NEW_TOKENS tokens, each decoding (its first
    token streamed) before the block runs; they end on their own after it."""
    started = [threading.Event() for _ in range(streams)]
    failures: list[str] = []

    def run(index: int) -> None:
        body = {
            "prompt": f"The cat {index}",
            "max_new_tokens": NEW_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST", f"{url}/v1/models/{model}/generate", json=body, timeout=120
            ) as answer:
                for line in answer.iter_lines():
                    if line.startswith("event: token"):
                        started[index].set()
                if answer.status_code != 200:
                    failures.append(f"HTTP {answer.status_code}")
        except httpx.HTTPError as exc:
            failures.append(repr(exc))
        finally:
            started[index].set()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(STARTED_S), "a background generation never started"
    assert not failures, failures
    try:
        yield
    finally:
        for thread in threads:
            thread.join(120)
    assert not failures, failures
