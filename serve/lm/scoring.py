"""Scoring completions: per-token log-probs of given text after a prompt, in one forward pass.

Every completion is one row (prompt + completion, right-padded to the longest); row ``i``'s
log-prob of completion token ``k`` is read at the position just before it. Log-probs are the
model's (temperature 1), float64. Full-vocabulary logits never leave this function.
"""

from __future__ import annotations

import numpy as np

from kernel.lm.sampling import chosen_log_probs, log_softmax, top_alternatives
from serve.lm.decoder import Decoder
from serve.lm.messages import CompletionScore, Scoring

__all__ = ["score"]


def score(decoder: Decoder, scoring: Scoring) -> tuple[CompletionScore, ...]:
    prompt = scoring.prompt_ids
    rows = [(*prompt, *completion) for completion in scoring.completion_ids]
    logits = decoder.forward(rows)
    start = len(prompt) - 1
    k = scoring.spec.top_logprobs
    scores = []
    for row, completion in enumerate(scoring.completion_ids):
        predicting = logits[row, start : start + len(completion)]
        tokens = np.asarray(completion, np.int64)
        if not k:
            log_probs = chosen_log_probs(predicting, tokens)
            scores.append(CompletionScore(completion, tuple(float(v) for v in log_probs)))
            continue
        table = log_softmax(predicting)  # the chosen and the likeliest from one table
        chosen = table[np.arange(len(tokens)), tokens]
        top = tuple(top_alternatives(position, k) for position in table)
        scores.append(CompletionScore(completion, tuple(float(v) for v in chosen), top))
    return tuple(scores)
