"""A decode batch's log-probs when a caller asks for more than the chosen tokens': the
likeliest alternatives at each new position, and the prompt's own tokens scored (echo)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kernel.lm.sampling import log_softmax, top_alternatives
from serve.lm.batch import DecodeBatch
from serve.lm.messages import Generation
from serve.lm.sequence import DecodingSequence
from tests.serve.lm import fakes
from tests.serve.lm.test_sequence import generation

PROMPT = (0, 3, 9, 4, 17)

BUDGET = 1 << 14  # max_batch_tokens


def asking(top: int, *, echo: bool = False, prompt: tuple[int, ...] = PROMPT) -> Generation:
    model = fakes.language_model()
    plain = generation(model, prompt, 6, ignore_eos=True)
    return replace(plain, spec=replace(plain.spec, top_logprobs=top, echo=echo))


def decoded(*generations: Generation) -> list[DecodingSequence]:
    """Each generation prefilled and stepped to its end in one batch."""
    model = fakes.language_model()
    batch: DecodeBatch[int] = DecodeBatch(fakes.FakeDecoder(), tokens=BUDGET)
    sequences = [model.sequence(g, streamed=False) for g in generations]
    for owner, sequence in enumerate(sequences):
        batch.prefill(owner, sequence)
    while len(batch):
        batch.step()
    return sequences


def test_top_alternatives_are_the_likeliest_in_order_ties_by_lower_id() -> None:
    log_probs = np.log(np.asarray([0.1, 0.3, 0.05, 0.3, 0.25]))
    assert [t for t, _ in top_alternatives(log_probs, 3)] == [1, 3, 4]
    assert top_alternatives(log_probs, 0) == ()
    assert len(top_alternatives(log_probs, 9)) == 5
    assert top_alternatives(log_probs, 1)[0][1] == float(log_probs[1])


def test_each_new_token_has_its_positions_likeliest_alternatives() -> None:
    (wanted, plain) = decoded(asking(3), asking(0))
    reference = fakes.FakeDecoder()
    assert plain.top == []
    assert wanted.token_ids == plain.token_ids  # asking changes nothing chosen
    assert len(wanted.top) == len(wanted.token_ids) == 6
    rows = reference.forward([PROMPT + tuple(wanted.token_ids)])[0]
    start = len(PROMPT) - 1
    for k, (token, log_prob, top) in enumerate(
        zip(wanted.token_ids, wanted.log_probs, wanted.top, strict=True)
    ):
        expected = top_alternatives(log_softmax(rows[start + k]), 3)
        assert top == expected
        assert top[0] == (token, log_prob)  # greedy: the chosen is the likeliest, same number
    assert np.allclose(wanted.log_probs, plain.log_probs, atol=1e-9)


def test_an_echoed_prompt_is_scored_token_by_token() -> None:
    (echoed,) = decoded(asking(2, echo=True))
    prompt = echoed.prompt
    assert prompt is not None
    rows = log_softmax(fakes.FakeDecoder().forward([PROMPT])[0])
    assert prompt.token_ids == PROMPT
    assert prompt.log_probs == tuple(float(rows[p, PROMPT[p + 1]]) for p in range(4))
    assert prompt.top == tuple(top_alternatives(rows[p], 2) for p in range(4))
    (unasked,) = decoded(asking(0))
    assert unasked.prompt is None
    (without_top,) = decoded(asking(0, echo=True))
    assert without_top.prompt is not None
    assert without_top.prompt.top == ()
    assert without_top.prompt.log_probs == prompt.log_probs


def test_a_prompt_prefilled_since_the_last_step_is_shared() -> None:
    model = fakes.language_model()
    decoder = fakes.FakeDecoder()
    batch: DecodeBatch[int] = DecodeBatch(decoder, tokens=BUDGET)
    first = model.sequence(asking(0), streamed=False)
    second = model.sequence(asking(0), streamed=False)
    other = model.sequence(asking(0, prompt=(0, 4, 4)), streamed=False)
    ran = [batch.prefill(i, s)[1] for i, s in enumerate((first, second, other))]
    assert ran == [len(PROMPT), 0, 3]  # the second shares the first's prefill
    assert [kind for kind, _ in decoder.calls] == ["prefill", "prefill"]
    while len(batch):
        batch.step()
    assert first.token_ids == second.token_ids  # greedy: the same continuation
    (alone,) = decoded(asking(0))
    assert first.token_ids == alone.token_ids
    later = model.sequence(asking(0), streamed=False)
    assert batch.prefill(9, later)[1] == len(PROMPT)  # after a step: run again


def test_a_shared_prefill_scores_an_echoed_prompt_for_each_count_of_alternatives() -> None:
    model = fakes.language_model()
    batch: DecodeBatch[int] = DecodeBatch(fakes.FakeDecoder(), tokens=BUDGET)
    asked = [asking(2, echo=True), asking(2, echo=True), asking(3, echo=True), asking(0)]
    sequences = [model.sequence(g, streamed=False) for g in asked]
    ran = [batch.prefill(i, s)[1] for i, s in enumerate(sequences)]
    assert ran == [len(PROMPT), 0, len(PROMPT), 0]  # alternatives not scored yet: run again
    rows = log_softmax(fakes.FakeDecoder().forward([PROMPT])[0])
    for sequence, k in zip(sequences[:3], (2, 2, 3), strict=True):
        assert sequence.prompt is not None
        assert sequence.prompt.top == tuple(top_alternatives(rows[p], k) for p in range(4))
    assert sequences[3].prompt is None
