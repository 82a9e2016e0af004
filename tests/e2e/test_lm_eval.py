"""lm-evaluation-harness (from PyPI, its own CLI) against a real server, with its defaults:
``local-completions`` with the checkpoint's huggingface tokenizer (token-id prompts),
batches of prompts and concurrent calls, on two small local tasks (a multiple-choice
loglikelihood task and a generate_until task), and ``local-chat-completions`` with the
chat template on the generate_until task. Its scores and per-sample answers equal
those of its own ``hf`` backend on the checkpoint the server's version was exported from.
The one argument given beyond the URL and tokenizer is ``add_bos_token=True``: its ``hf``
backend encodes as the tokenizer does by default (with this Llama tokenizer's BOS), its API
backends without a BOS unless told, so the two see the same token ids only with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LM_MODEL, Exported
from tests.e2e.server import Server

QUESTIONS = [
    {"question": "The cat sits on the", "choices": [" mat", " dog", " garden"], "answer": 0},
    {"question": "The small dog sleeps in the", "choices": [" garden", " cat"], "answer": 0},
    {"question": "What does the bird do?", "choices": [" It sings", " The"], "answer": 1},
    {"question": "The", "choices": [" cat", " dog sleeps", " small"], "answer": 2},
]
PROMPTS = [
    {"question": "The cat", "answer": "sits"},
    {"question": "The small dog sleeps in the garden and the", "answer": "cat"},
    {"question": "What does the bird do?", "answer": "sings"},
]
TASKS: dict[str, dict[str, Any]] = {
    "rlserve_choice": {
        "output_type": "multiple_choice",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "acc"}],
    },
    "rlserve_until": {
        "output_type": "generate_until",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["."], "max_gen_toks": 12, "do_sample": False},
        "metric_list": [{"metric": "exact_match"}],
    },
}
LOGLIKELIHOOD_TOLERANCE = 1e-3  # a continuation's summed log-probs: onnxruntime against torch


@pytest.fixture(scope="module")
def server(lm_server: Server) -> Server:
    return lm_server


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two tasks' YAML files and their local JSON data (no hub)."""
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    for name, docs in (("rlserve_choice", QUESTIONS), ("rlserve_until", PROMPTS)):
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
        config = {
            "task": name,
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test",
            "doc_to_text": "{{question}}",
            **TASKS[name],
        }
        (folder / f"{name}.yaml").write_text(json.dumps(config))  # YAML reads JSON
    return folder


def evaluate(
    tasks: Path, out: Path, model: str, model_args: str, *extra: str, names: tuple[str, ...] = ()
) -> dict[str, Any]:
    """lm_eval's CLI in its own process (on ``names``, default every task); its results and
    per-sample records by task."""
    names = names or tuple(TASKS)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(out / "datasets"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [
        sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args,
        "--tasks", ",".join(names), "--include_path", str(tasks), "--output_path", str(out),
        "--log_samples", "--batch_size", "2", "--device", "cpu", *extra,
    ]  # fmt: skip
    ran = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-6000:]
    (results,) = out.rglob("results_*.json")
    samples = {
        name: [
            json.loads(line)
            for line in next(out.rglob(f"samples_{name}_*.jsonl")).read_text().splitlines()
        ]
        for name in names
    }
    return {"results": json.loads(results.read_text())["results"], "samples": samples}


def answers(run: dict[str, Any], task: str) -> list[Any]:
    return [s["filtered_resps"] for s in sorted(run["samples"][task], key=lambda s: s["doc_id"])]


def test_lm_eval_with_its_defaults_scores_the_server_as_its_hf_backend(
    server: Server, exported: Exported, tasks: Path, tmp_path: Path
) -> None:
    checkpoint = exported.sources[1]
    served = evaluate(
        tasks, tmp_path / "served", "local-completions",
        f"model={LM_MODEL},base_url={server.url}/v1/completions,tokenizer={checkpoint},"
        "num_concurrent=2,add_bos_token=True",
    )  # fmt: skip
    reference = evaluate(tasks, tmp_path / "hf", "hf", f"pretrained={checkpoint},dtype=float32")
    for ours, theirs in zip(
        answers(served, "rlserve_choice"), answers(reference, "rlserve_choice"), strict=True
    ):
        assert len(ours) == len(theirs)
        for (ll, greedy), (expected_ll, expected_greedy) in zip(ours, theirs, strict=True):
            assert float(ll) == pytest.approx(float(expected_ll), abs=LOGLIKELIHOOD_TOLERANCE)
            assert greedy == expected_greedy
    assert answers(served, "rlserve_until") == answers(reference, "rlserve_until")
    for task, metric in (("rlserve_choice", "acc,none"), ("rlserve_until", "exact_match,none")):
        assert served["results"][task][metric] == reference["results"][task][metric]


def test_lm_eval_chat_completions_generate_as_its_hf_backend_with_the_chat_template(
    server: Server, exported: Exported, tasks: Path, tmp_path: Path
) -> None:
    checkpoint = exported.sources[1]
    chat = ("--apply_chat_template",)
    served = evaluate(
        tasks, tmp_path / "served", "local-chat-completions",
        f"model={LM_MODEL},base_url={server.url}/v1/chat/completions,tokenizer={checkpoint},"
        "num_concurrent=2", *chat, names=("rlserve_until",),
    )  # fmt: skip
    reference = evaluate(
        tasks, tmp_path / "hf", "hf", f"pretrained={checkpoint},dtype=float32", *chat,
        names=("rlserve_until",),
    )  # fmt: skip
    assert answers(served, "rlserve_until") == answers(reference, "rlserve_until")
