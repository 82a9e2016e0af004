"""Greedy decoding and scoring of one sequence over a ``causal-lm`` graph, with numpy only.

This is the reference decoder: the exporter runs it on onnxruntime to prove parity against
``transformers.generate``, and the server runs it when it loads a version to reproduce the
contract's golden prompts. It is not the serving path (that batches many sequences).

``run`` is any ``feeds -> outputs`` callable over the graph (an onnxruntime session's
``run``, with tensors by name). Log-probs are ``log_softmax`` of the logits in float64,
natural log. Greedy decoding stops after an EOS of ``contract.eos_token_ids`` (the EOS is
kept in the ids, as ``transformers.generate`` keeps it), after ``max_new_tokens``, or when
the context is full.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kernel.lm.contract import GoldenPrompt, LanguageModelContract
from kernel.lm.sampling import log_softmax

__all__ = ["Runner", "check_golden", "empty_cache", "greedy", "score"]

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
Cache = dict[str, np.ndarray]  # past tensor name -> [batch, kv_heads, past, head_dim]


def empty_cache(contract: LanguageModelContract, batch: int) -> Cache:
    """Past tensors of length 0: what a prefill takes."""
    shape = (batch, contract.num_kv_heads, 0, contract.head_dim)
    cache: Cache = {}
    for layer in range(contract.num_layers):
        key, value, _, _ = contract.cache_names(layer)
        cache[key] = np.zeros(shape, np.float32)
        cache[value] = np.zeros(shape, np.float32)
    return cache


def forward(
    run: Runner,
    contract: LanguageModelContract,
    ids: np.ndarray,
    positions: np.ndarray,
    attention_mask: np.ndarray,
    cache: Cache,
) -> tuple[np.ndarray, Cache]:
    """One call of the graph: (logits [batch, sequence, vocab], the cache for the next call)."""
    t = contract.tensors
    feeds = {
        t.input_ids: ids.astype(np.int64),
        t.attention_mask: attention_mask.astype(np.int64),
        **cache,
    }
    if t.position_ids is not None:  # else the graph computes them from the mask
        feeds[t.position_ids] = positions.astype(np.int64)
    outputs = run(feeds)
    present: Cache = {}
    for layer in range(contract.num_layers):
        past_key, past_value, present_key, present_value = contract.cache_names(layer)
        present[past_key] = outputs[present_key]
        present[past_value] = outputs[present_value]
    return outputs[t.logits], present


def greedy(
    run: Runner,
    contract: LanguageModelContract,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
) -> tuple[list[int], list[float]]:
    """The greedy continuation of ``prompt_ids`` and the log-prob of each chosen token."""
    if not prompt_ids:
        raise ValueError("prompt_ids: empty; a prompt needs at least one token")
    eos = set(contract.eos_token_ids)
    budget = min(max_new_tokens, contract.context_length - len(prompt_ids))
    ids = np.asarray([list(prompt_ids)], np.int64)
    positions = np.arange(len(prompt_ids), dtype=np.int64)[None, :]
    cache = empty_cache(contract, 1)
    new_ids: list[int] = []
    log_probs: list[float] = []
    while len(new_ids) < budget:
        total = len(prompt_ids) + len(new_ids)
        logits, cache = forward(run, contract, ids, positions, np.ones((1, total), np.int64), cache)
        last = logits[0, -1]
        token = int(np.argmax(last))
        new_ids.append(token)
        log_probs.append(float(log_softmax(last)[token]))
        if token in eos:
            break
        ids = np.asarray([[token]], np.int64)
        positions = np.asarray([[total]], np.int64)
    return new_ids, log_probs


def score(
    run: Runner,
    contract: LanguageModelContract,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
) -> list[float]:
    """log p(completion[k] | prompt + completion[:k]) for each k, from one forward pass."""
    if not prompt_ids:
        raise ValueError("prompt_ids: empty; scoring needs at least one prompt token")
    if not completion_ids:
        return []
    tokens = [*prompt_ids, *completion_ids]
    ids = np.asarray([tokens], np.int64)
    positions = np.arange(len(tokens), dtype=np.int64)[None, :]
    mask = np.ones((1, len(tokens)), np.int64)
    logits, _ = forward(run, contract, ids, positions, mask, empty_cache(contract, 1))
    predicting = log_softmax(logits[0, len(prompt_ids) - 1 : -1])
    targets = np.asarray(completion_ids, np.int64)
    return [float(v) for v in predicting[np.arange(len(targets)), targets]]


def check_golden(contract: LanguageModelContract, run: Runner) -> list[str]:
    """Decode every golden prompt greedily; one line per mismatch (empty: the model is intact).

    Greedy ids must match exactly; each log-prob within ``golden_atol`` (absolute).
    """
    problems: list[str] = []
    for index, golden in enumerate(contract.golden):
        ids, log_probs = greedy(run, contract, golden.prompt_ids, len(golden.greedy_ids))
        problem = _golden_problem(golden, ids, log_probs, contract.golden_atol)
        if problem is not None:
            problems.append(f"golden prompt {index} ({len(golden.prompt_ids)} tokens): {problem}")
    return problems


def _golden_problem(
    golden: GoldenPrompt, ids: list[int], log_probs: list[float], atol: float
) -> str | None:
    if ids != golden.greedy_ids:
        at = next(
            (k for k, (a, b) in enumerate(zip(ids, golden.greedy_ids, strict=False)) if a != b),
            min(len(ids), len(golden.greedy_ids)),
        )
        return (
            f"greedy tokens differ from new token {at}: got {ids[at : at + 4]}, expected "
            f"{golden.greedy_ids[at : at + 4]} ({len(ids)} and {len(golden.greedy_ids)} new "
            "tokens)"
        )
    diff = np.abs(np.asarray(log_probs) - np.asarray(golden.log_probs, np.float64))
    if diff.size and float(diff.max()) > atol:
        worst = int(np.argmax(diff))
        return (
            f"log-prob of new token {worst} is {log_probs[worst]:.7g}, expected "
            f"{golden.log_probs[worst]:.7g} (|difference| {diff[worst]:.3g} > {atol:g})"
        )
    return None
