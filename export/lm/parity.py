"""The parity gate: onnxruntime must decode what transformers decodes, or nothing is written.

For every prompt: greedy decoding on onnxruntime (:mod:`kernel.lm.greedy`, the decoder the
server re-runs at load) must give exactly the tokens ``transformers.generate`` gave; the
log-probs of those tokens, and of a given completion scored in one pass, must agree within
``atol`` (absolute, natural log); and the ``tokenizers`` library alone, reading the
``tokenizer.json`` that will be written, must encode the prompt and completion to the ids
transformers gave. A padded batch of prompts of different lengths (the way the server
decodes: left-padded, or right-padded for a graph whose cache layout is
``sequence_lengths``) must give every row the next-token log-probs and argmax of its
single-sequence calls, at the prefill and at one decode step after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from export.lm.golden import Prompt, PromptKind, Reference
from kernel.lm import greedy
from kernel.lm.contract import CacheLayout, LanguageModelContract
from kernel.lm.greedy import Runner, empty_cache, forward
from kernel.lm.sampling import log_softmax

_BATCH_ROWS = 3


@dataclass(frozen=True)
class PromptRow:
    index: int
    kind: PromptKind
    prompt_tokens: int
    new_tokens: int  # what transformers generated
    first_mismatch: int | None  # the first new token onnxruntime chose differently
    greedy_diff: float  # max |log-prob difference| over the tokens both chose
    completion_tokens: int
    completion_diff: float
    tokenizer_same: bool
    passed: bool


@dataclass(frozen=True)
class BatchRow:
    layout: CacheLayout  # how the rows were padded
    lengths: list[int]  # the rows' prompt lengths
    prefill_diff: float  # max |log-prob difference| of the next token, over rows and vocabulary
    step_diff: float  # the same after one decode step with the batched cache
    same_argmax: bool
    passed: bool


@dataclass(frozen=True)
class ParityReport:
    prompts: list[PromptRow]
    batch: BatchRow | None  # None with fewer than two prompt lengths
    new_tokens: int
    atol: float

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.prompts) and (self.batch is None or self.batch.passed)

    @property
    def max_greedy_diff(self) -> float:
        return max((row.greedy_diff for row in self.prompts), default=0.0)

    @property
    def max_completion_diff(self) -> float:
        return max((row.completion_diff for row in self.prompts), default=0.0)

    def table(self) -> str:
        lines = [
            f"parity on {len(self.prompts)} prompts, greedy up to {self.new_tokens} new tokens "
            f"(greedy tokens exactly; log-probs |onnx - transformers| <= {self.atol:g})",
            f"{'#':>3} {'kind':<4} {'prompt':>6} {'new':>4}  {'greedy tokens':<16} "
            f"{'max dlogp':>9}  {'completion':>10} {'max dlogp':>9}  {'tokenizer':<9}  result",
        ]
        lines += [_prompt_line(row) for row in self.prompts]
        if self.batch is not None:
            lines.append(_batch_line(self.batch))
        lines.append(f"parity {'PASSED' if self.passed else 'FAILED'}")
        return "\n".join(lines)


def compare(
    contract: LanguageModelContract,
    run: Runner,
    prompts: list[Prompt],
    references: list[Reference],
    tokenizer_json: str,
    *,
    new_tokens: int,
    atol: float,
) -> ParityReport:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    rows = [
        _prompt_row(index, contract, run, prompt, reference, tokenizer, atol)
        for index, (prompt, reference) in enumerate(zip(prompts, references, strict=True))
    ]
    batch = _batch_row(contract, run, prompts, atol)
    return ParityReport(prompts=rows, batch=batch, new_tokens=new_tokens, atol=atol)


def _prompt_row(
    index: int,
    contract: LanguageModelContract,
    run: Runner,
    prompt: Prompt,
    reference: Reference,
    tokenizer: object,
    atol: float,
) -> PromptRow:
    ids, log_probs = greedy.greedy(run, contract, prompt.ids, len(reference.greedy_ids))
    mismatch = _first_mismatch(ids, reference.greedy_ids)
    shared = len(reference.greedy_ids) if mismatch is None else mismatch
    greedy_diff = _max_diff(log_probs[:shared], reference.greedy_log_probs[:shared])
    scored = greedy.score(run, contract, prompt.ids, prompt.completion_ids)
    completion_diff = _max_diff(scored, reference.completion_log_probs)
    same_tokens = _tokenizer_agrees(tokenizer, prompt, contract.eos_token_ids)
    passed = mismatch is None and greedy_diff <= atol and completion_diff <= atol and same_tokens
    return PromptRow(
        index=index,
        kind=prompt.kind,
        prompt_tokens=len(prompt.ids),
        new_tokens=len(reference.greedy_ids),
        first_mismatch=mismatch,
        greedy_diff=greedy_diff,
        completion_tokens=len(prompt.completion_ids),
        completion_diff=completion_diff,
        tokenizer_same=same_tokens,
        passed=passed,
    )


def _first_mismatch(ours: list[int], theirs: list[int]) -> int | None:
    for k, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return k
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def _max_diff(ours: list[float], theirs: list[float]) -> float:
    if len(ours) != len(theirs):
        return float("inf")
    if not ours:
        return 0.0
    diff = np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))
    return float(np.nan_to_num(diff, nan=np.inf).max())


def _tokenizer_agrees(tokenizer: object, prompt: Prompt, eos: list[int]) -> bool:
    """tokenizer.json alone gives transformers' ids (a prompt cut to fit: as a prefix)."""
    text = tokenizer.encode(prompt.text, add_special_tokens=prompt.add_special_tokens).ids  # type: ignore[attr-defined]
    completion = tokenizer.encode(prompt.completion_text, add_special_tokens=False).ids  # type: ignore[attr-defined]
    given = prompt.completion_ids
    if given and given[-1] in eos and completion == given[:-1]:
        given = given[:-1]
    return bool(text[: len(prompt.ids)] == prompt.ids and completion == given)


def _batch_row(
    contract: LanguageModelContract, run: Runner, prompts: list[Prompt], atol: float
) -> BatchRow | None:
    chosen = _uneven(prompts)
    if len(chosen) < 2:
        return None
    singles = [_single(contract, run, p.ids) for p in chosen]
    width = max(len(p.ids) for p in chosen)
    pad = contract.pad_token_id if contract.pad_token_id is not None else 0
    ids = np.full((len(chosen), width), pad, np.int64)
    mask = np.zeros((len(chosen), width), np.int64)
    positions = np.zeros((len(chosen), width), np.int64)
    step_mask = np.zeros((len(chosen), width + 1), np.int64)
    right = contract.cache_layout is CacheLayout.SEQUENCE_LENGTHS  # a row's tokens come first
    last = []  # each row's last prompt column
    for row, prompt in enumerate(chosen):
        n = len(prompt.ids)
        used = slice(0, n) if right else slice(width - n, width)
        ids[row, used] = prompt.ids
        mask[row, used] = 1
        positions[row, used] = np.arange(n)
        if right:
            step_mask[row, : n + 1] = 1  # the new token goes just after the row's own
        else:
            step_mask[row, width - n :] = 1
        last.append(n - 1 if right else width - 1)
    logits, cache = forward(run, contract, ids, positions, mask, empty_cache(contract, len(chosen)))
    prefill = log_softmax(logits[np.arange(len(chosen)), last])
    following = np.asarray([[s.next_token] for s in singles], np.int64)
    step_positions = np.asarray([[len(p.ids)] for p in chosen], np.int64)
    step_logits, _ = forward(run, contract, following, step_positions, step_mask, cache)
    step = log_softmax(step_logits[:, -1])
    prefill_diff = _array_diff(prefill, np.stack([s.prefill for s in singles]))
    step_diff = _array_diff(step, np.stack([s.step for s in singles]))
    same_argmax = bool(
        np.array_equal(prefill.argmax(-1), [s.next_token for s in singles])
        and np.array_equal(step.argmax(-1), [int(s.step.argmax()) for s in singles])
    )
    passed = same_argmax and prefill_diff <= atol and step_diff <= atol
    lengths = [len(p.ids) for p in chosen]
    return BatchRow(contract.cache_layout, lengths, prefill_diff, step_diff, same_argmax, passed)


@dataclass(frozen=True)
class _Single:
    prefill: np.ndarray  # next-token log-probs after the prompt
    next_token: int
    step: np.ndarray  # next-token log-probs after prompt + next_token


def _single(contract: LanguageModelContract, run: Runner, prompt_ids: list[int]) -> _Single:
    n = len(prompt_ids)
    ids = np.asarray([prompt_ids], np.int64)
    logits, cache = forward(
        run,
        contract,
        ids,
        np.arange(n)[None, :],
        np.ones((1, n), np.int64),
        empty_cache(contract, 1),
    )
    prefill = log_softmax(logits[0, -1])
    token = int(prefill.argmax())
    step_logits, _ = forward(
        run,
        contract,
        np.asarray([[token]]),
        np.asarray([[n]]),
        np.ones((1, n + 1), np.int64),
        cache,
    )
    return _Single(prefill, token, log_softmax(step_logits[0, -1]))


def _uneven(prompts: list[Prompt]) -> list[Prompt]:
    """Up to three prompts of different lengths, the longest first seen among them."""
    chosen: list[Prompt] = []
    for prompt in sorted(prompts, key=lambda p: len(p.ids), reverse=True):
        if all(len(p.ids) != len(prompt.ids) for p in chosen):
            chosen.append(prompt)
        if len(chosen) == _BATCH_ROWS:
            break
    return chosen


def _array_diff(ours: np.ndarray, theirs: np.ndarray) -> float:
    diff = np.abs(ours - theirs)
    return float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0


def _prompt_line(row: PromptRow) -> str:
    greedy_text = "identical" if row.first_mismatch is None else f"differ at {row.first_mismatch}"
    return (
        f"{row.index:>3} {row.kind.value:<4} {row.prompt_tokens:>6} {row.new_tokens:>4}  "
        f"{greedy_text:<16} {row.greedy_diff:>9.2g}  {row.completion_tokens:>10} "
        f"{row.completion_diff:>9.2g}  {'same' if row.tokenizer_same else 'DIFFERS':<9}  "
        f"{'pass' if row.passed else 'FAIL'}"
    )


def _batch_line(row: BatchRow) -> str:
    lengths = ", ".join(map(str, row.lengths))
    argmax = "same argmax" if row.same_argmax else "ARGMAX DIFFERS"
    return (
        f"padded batch of {len(row.lengths)} ({row.layout.value}, prompt lengths {lengths}): "
        "next-token max "
        f"dlogp {row.prefill_diff:.2g} at prefill, {row.step_diff:.2g} after one decode step, "
        f"{argmax}: {'pass' if row.passed else 'FAIL'}"
    )
