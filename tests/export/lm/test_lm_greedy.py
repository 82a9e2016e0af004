"""kernel.lm.greedy on a written model: EOS and context stops, the KV cache against one pass,
and golden checks that fail when the model or the record is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from export.lm import pipeline
from kernel.lm import greedy
from kernel.lm.contract import GoldenPrompt, LanguageModelContract


@pytest.fixture(scope="module")
def written(llama_export: pipeline.LmExportOutcome) -> tuple[LanguageModelContract, greedy.Runner]:
    assert llama_export.path is not None
    path: Path = llama_export.path / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    return pipeline.read_contract(path), run


def _first_new_at(ids: list[int]) -> int:
    """The index of a token whose first occurrence is past the start (or 0)."""
    return next((k for k in range(1, len(ids)) if ids[k] not in ids[:k]), 0)


def test_greedy_stops_after_an_eos_and_keeps_it(written) -> None:
    contract, run = written
    golden = contract.golden[0]
    ids, _ = greedy.greedy(run, contract, golden.prompt_ids, 32)
    assert ids == golden.greedy_ids
    k = _first_new_at(ids)
    stopping = contract.model_copy(update={"eos_token_ids": [ids[k]]})
    stopped, log_probs = greedy.greedy(run, stopping, golden.prompt_ids, 32)
    assert stopped == ids[: k + 1]
    assert len(log_probs) == k + 1


def test_greedy_stops_when_the_context_is_full(written) -> None:
    contract, run = written
    prompt = contract.golden[0].prompt_ids
    short = contract.model_copy(update={"context_length": len(prompt) + 3})
    ids, _ = greedy.greedy(run, short, prompt, 32)
    assert ids == contract.golden[0].greedy_ids[:3]


def test_decoding_with_the_cache_scores_like_one_pass(written) -> None:
    contract, run = written
    for golden in contract.golden:
        ids, log_probs = greedy.greedy(run, contract, golden.prompt_ids, 32)
        scored = greedy.score(run, contract, golden.prompt_ids, ids)
        assert np.max(np.abs(np.asarray(scored) - log_probs)) < 1e-5
        assert all(p <= 0 for p in scored)
    assert greedy.score(run, contract, contract.golden[0].prompt_ids, []) == []


def test_check_golden_reports_a_record_that_does_not_match(written) -> None:
    contract, run = written
    golden = contract.golden[0]
    shifted = GoldenPrompt(
        prompt_ids=golden.prompt_ids,
        greedy_ids=golden.greedy_ids,
        log_probs=[p + (1e-3 if k == 2 else 0.0) for k, p in enumerate(golden.log_probs)],
    )
    other_token = (golden.greedy_ids[1] + 1) % contract.vocab_size
    wrong = GoldenPrompt(
        prompt_ids=golden.prompt_ids,
        greedy_ids=[golden.greedy_ids[0], other_token, *golden.greedy_ids[2:]],
        log_probs=golden.log_probs,
    )
    problems = greedy.check_golden(contract.model_copy(update={"golden": [shifted, wrong]}), run)
    assert len(problems) == 2
    assert problems[0].startswith("golden prompt 0")
    assert "log-prob of new token 2" in problems[0]
    assert problems[1].startswith("golden prompt 1")
    assert "differ from new token 1" in problems[1]


def test_an_empty_prompt_is_refused(written) -> None:
    contract, run = written
    with pytest.raises(ValueError, match="prompt_ids: empty"):
        greedy.greedy(run, contract, [], 4)
