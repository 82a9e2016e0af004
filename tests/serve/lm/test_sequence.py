"""One sequence's end: EOS, max_new_tokens, stop strings, and the text it hands out."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kernel.lm.sampling import SamplingParams
from serve.lm.messages import FinishReason, Generation, GenerationSpec
from serve.lm.model import LanguageModel
from tests.serve.lm import fakes


def generation(
    model: LanguageModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop: tuple[str, ...] = (),
    *,
    ignore_eos: bool = False,
) -> Generation:
    spec = GenerationSpec(
        "x", None, max_new_tokens, None, None, None, None, stop, "id", 0.0, 1e9,
        ignore_eos=ignore_eos,
    )  # fmt: skip
    return Generation(
        spec, model.version, tuple(prompt_ids), max_new_tokens,
        SamplingParams(0.0, 1.0, 0, None), model.eos,
    )  # fmt: skip


def feed(model: LanguageModel, tokens: list[int], stop: tuple[str, ...] = (), budget: int = 50):
    sequence = model.sequence(generation(model, [0, 3], budget, stop), streamed=True)
    events = []
    for token in tokens:
        events.append(sequence.accept(token, -1.0))
        if sequence.finish is not None:
            break
    return sequence, events


def test_eos_ends_it_and_stays_in_the_ids_but_not_in_the_text():
    model = fakes.language_model()
    sequence, events = feed(
        model, [fakes.word("w1"), fakes.word("w2"), fakes.EOS, fakes.word("w3")]
    )
    assert sequence.finish is FinishReason.STOP
    assert sequence.token_ids == [fakes.word("w1"), fakes.word("w2"), fakes.EOS]
    assert sequence.text == "w1 w2"
    assert "".join(e.text for e in events) == sequence.text


def test_max_new_tokens_ends_it_with_length():
    sequence, _ = feed(fakes.language_model(), [fakes.word("w1")] * 10, budget=3)
    assert sequence.finish is FinishReason.LENGTH
    assert len(sequence.token_ids) == 3


@pytest.mark.parametrize("streamed", [True, False])
def test_ignore_eos_runs_exactly_max_new_tokens_with_eos_kept_as_a_token(streamed):
    model = fakes.language_model()
    tokens = [fakes.word("w1"), fakes.EOS, fakes.word("w2"), fakes.EOS, fakes.word("w3")]
    sequence = model.sequence(generation(model, [0, 3], 4, ignore_eos=True), streamed=streamed)
    for token in tokens:
        assert sequence.finish is None  # neither EOS ended it
        sequence.accept(token, -1.0)
        if sequence.finish is not None:
            break
    assert sequence.finish is FinishReason.LENGTH
    assert sequence.token_ids == tokens[:4]
    assert sequence.text == "w1 w2"  # special tokens stay out of the text


def test_a_stop_string_ends_it_and_the_text_stops_before_it():
    model = fakes.language_model()
    tokens = [fakes.word(w) for w in ("w1", "w2", "w3", "w4", "w5")]
    sequence, events = feed(model, tokens, stop=("w3 w4",))
    assert sequence.finish is FinishReason.STOP
    assert sequence.token_ids == tokens[:4]  # the tokens that completed it are kept
    assert sequence.text == "w1 w2 "
    streamed = "".join(e.text for e in events)
    assert streamed == sequence.text  # never past the stop string, even for a moment


def test_text_that_may_start_a_stop_string_waits_until_it_cannot():
    model = fakes.language_model()
    tokens = [fakes.word(w) for w in ("w1", "w2", "w5", "w6")]
    sequence, events = feed(model, tokens, stop=("w2 w3",), budget=4)
    pieces = [e.text for e in events]
    assert pieces[1] == " "  # "w2" might become "w2 w3": held back
    assert pieces[2] == "w2 w5"
    assert sequence.finish is FinishReason.LENGTH
    assert "".join(pieces) == sequence.text == "w1 w2 w5 w6"


def test_text_nobody_streams_is_decoded_once_at_the_end_and_is_the_same():
    model = fakes.language_model()
    tokens = [fakes.word(w) for w in ("w1", "w2", "w3")] + [fakes.EOS]
    quiet = model.sequence(generation(model, [0, 3], 10), streamed=False)
    events = [quiet.accept(t, -1.0) for t in tokens]
    streamed, _ = feed(model, tokens)
    assert [e.text for e in events] == ["", "", "", ""]
    assert quiet.text == streamed.text == "w1 w2 w3"
    assert quiet.finish is FinishReason.STOP
