"""Generate and score bodies: every wrong field named, with its value and what is valid."""

from __future__ import annotations

import pytest

from kernel.errors import InvalidInput
from serve.lm.requests import choice_seed, generation_spec, generation_specs, score_spec
from tests.serve.lm import fakes


def spec(**payload):
    return generation_spec(payload, "id", 0.0, 1.0)


def test_a_full_body_is_read():
    got = spec(prompt="w1", max_new_tokens=4, temperature=0.7, top_p=0.9, top_k=5, seed=7,
               stop=["w9"])  # fmt: skip
    assert (got.prompt, got.max_new_tokens, got.temperature, got.top_p, got.top_k, got.seed) == (
        "w1", 4, 0.7, 0.9, 5, 7,
    )  # fmt: skip
    assert got.stop == ("w9",)
    assert spec(prompt="w1", stop="w2").stop == ("w2",)
    assert not got.ignore_eos
    assert spec(prompt="w1", ignore_eos=True).ignore_eos


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "prompt, messages: give exactly one"),
        ({"prompt": "w1", "messages": []}, "prompt, messages: give exactly one"),
        ({"prompt": ""}, "prompt: empty"),
        ({"prompt": 3}, "prompt: expected a string of text or a list of token ids, got 3"),
        ({"prompt": []}, "prompt: an empty list of token ids"),
        ({"prompt": [3, -1]}, r"prompt\[1\]: expected a token id \(an integer >= 0\), got -1"),
        ({"prompt": [3, False]}, r"prompt\[1\]: expected a token id .*, got false"),
        ({"prompt": [[3]]}, r"prompt\[0\]: expected a token id .*, got \[3\]"),
        ({"messages": []}, "messages: expected a non-empty list"),
        (
            {"messages": [{"role": "user"}]},
            r"messages\[0\]\.content: expected a string, got nothing",
        ),
        ({"messages": ["hi"]}, r"messages\[0\]: expected an object"),
        (
            {"messages": [{"role": "root", "content": "obey"}]},
            r'messages\[0\]\.role: "root" is not a chat role; expected one of system, developer',
        ),
        ({"messages": [{"role": "", "content": "x"}]}, r'messages\[0\]\.role: "" is not'),
        (
            {"prompt": "w1", "max_new_tokens": 0},
            "max_new_tokens: expected an integer >= 1, got 0",
        ),
        ({"prompt": "w1", "max_new_tokens": 2.5}, "max_new_tokens: expected an integer >= 1"),
        ({"prompt": "w1", "max_new_tokens": True}, "max_new_tokens: expected an integer"),
        ({"prompt": "w1", "temperature": -1}, "temperature: expected a number >= 0"),
        ({"prompt": "w1", "temperature": "hot"}, "temperature: expected a number >= 0"),
        ({"prompt": "w1", "top_p": 0}, r"top_p: expected a number in \(0, 1\], got 0"),
        ({"prompt": "w1", "top_p": 1.5}, r"top_p: expected a number in \(0, 1\]"),
        ({"prompt": "w1", "top_k": -1}, "top_k: expected an integer >= 0"),
        ({"prompt": "w1", "seed": -5}, "seed: expected an integer in"),
        ({"prompt": "w1", "stop": [""]}, "stop: expected a non-empty string"),
        ({"prompt": "w1", "stop": ["a"] * 17}, "stop: 17 strings given; send at most 16"),
        ({"prompt": "w1", "ignore_eos": 1}, "ignore_eos: expected true or false, got 1"),
        ({"prompt": "w1", "logits": True}, r"unknown field\(s\) \['logits'\]"),
        ({"prompt": "w1", "logits": True}, "'ignore_eos'"),  # the error lists what is valid
    ],
)
def test_a_wrong_field_is_named(payload, message):
    with pytest.raises(InvalidInput, match=message):
        spec(**payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"prompt": "w1"}, "completions: expected a non-empty list"),
        ({"prompt": "w1", "completions": []}, "completions: expected a non-empty list"),
        ({"prompt": "w1", "completions": ["w2", ""]}, r"completions\[1\]: expected a non-empty"),
        ({"prompt": "w1", "completions": ["w2"] * 65}, "completions: 65 given; send at most 64"),
    ],
)
def test_a_wrong_score_field_is_named(payload, message):
    with pytest.raises(InvalidInput, match=message):
        score_spec(payload, "id", 0.0, 1.0)


def test_a_score_prompt_is_text():
    with pytest.raises(InvalidInput, match=r"prompt: expected a string of text, got \[3, 4\]"):
        score_spec({"prompt": [3, 4], "completions": ["w1"]}, "id", 0.0, 1.0)


def test_the_version_checks_the_prompt_against_its_context_and_cuts_max_new_tokens():
    model = fakes.language_model(context_length=8)
    with pytest.raises(InvalidInput, match="prompt: 8 tokens, longer than model 'fake' can take"):
        model.prepare_generation(spec(prompt="w1 w2 w3 w4 w5 w6 w7"))
    fits = model.prepare_generation(spec(prompt="w1 w2", max_new_tokens=5))
    assert fits.prompt_ids == (fakes.BOS, fakes.word("w1"), fakes.word("w2"))
    assert fits.max_new_tokens == 5
    # beyond the context: generated up to it (finish_reason length), as vLLM does
    assert model.prepare_generation(spec(prompt="w1 w2", max_new_tokens=6)).max_new_tokens == 5
    assert model.prepare_generation(spec(prompt="w1 w2")).max_new_tokens == 5  # room, not 8
    ignoring = model.prepare_generation(spec(prompt="w1 w2", max_new_tokens=99, ignore_eos=True))
    assert ignoring.max_new_tokens == 5


def test_a_prompt_of_token_ids_is_checked_against_the_vocabulary():
    model = fakes.language_model(context_length=8)
    ids = [fakes.BOS, fakes.word("w1"), fakes.word("w2")]
    as_ids = model.prepare_generation(spec(prompt=ids, max_new_tokens=3))
    assert as_ids.prompt_ids == model.prepare_generation(spec(prompt="w1 w2")).prompt_ids
    assert as_ids.max_new_tokens == 3
    assert model.prepare_generation(spec(prompt=[fakes.VOCAB - 1])).prompt_ids == (63,)
    with pytest.raises(InvalidInput) as caught:
        model.prepare_generation(spec(prompt=[3, fakes.VOCAB]))
    assert caught.value.message == (
        f"prompt[1]: token id {fakes.VOCAB} is outside the vocabulary of model 'fake': its ids are "
        f"0 to {fakes.VOCAB - 1}"
    )
    with pytest.raises(InvalidInput, match="prompt: 8 tokens, longer than"):
        model.prepare_generation(spec(prompt=[3] * 8))


def test_defaults_fill_what_a_call_leaves_out():
    model = fakes.language_model(
        generation_defaults={
            "max_new_tokens": 3,
            "temperature": 0.6,
            "top_p": 0.8,
            "do_sample": True,
        }
    )
    prepared = model.prepare_generation(spec(prompt="w1"))
    assert prepared.max_new_tokens == 3
    assert (prepared.sampling.temperature, prepared.sampling.top_p) == (0.6, 0.8)
    greedy_by_default = fakes.language_model().prepare_generation(spec(prompt="w1"))
    assert greedy_by_default.sampling.greedy
    asked = fakes.language_model().prepare_generation(spec(prompt="w1", temperature=0.9))
    assert asked.sampling.temperature == 0.9


def test_a_completion_must_fit_the_context_after_the_prompt():
    model = fakes.language_model(context_length=6)
    body = {"prompt": "w1 w2", "completions": ["w3", "w3 w4 w5 w6"]}
    with pytest.raises(InvalidInput, match=r"completions\[1\]: 4 tokens after a prompt of 3"):
        model.prepare_scoring(score_spec(body, "id", 0.0, 1.0))


def test_n_gives_a_group_each_with_its_own_seed_and_the_prompt_tokenized_once():
    specs = generation_specs({"prompt": "w1 w2", "n": 3, "seed": 5}, "id", 0.0, 1.0)
    assert [s.seed for s in specs] == [5, choice_seed(5, 1), choice_seed(5, 2)]
    assert len({s.seed for s in specs}) == 3
    unseeded = generation_specs({"prompt": "w1", "n": 2}, "id", 0.0, 1.0)
    assert [s.seed for s in unseeded] == [None, None]  # each draws its own
    model = fakes.language_model()
    group = model.prepare_generations(specs)
    assert [g.sampling.seed for g in group] == [s.seed for s in specs]
    assert group[1].prompt_ids is group[0].prompt_ids  # taken as they are, not re-encoded
    other = model.prepare_generations([specs[0], spec(prompt="w3", seed=5)])
    assert other[1].prompt_ids == model.prepare_generation(spec(prompt="w3")).prompt_ids
    with pytest.raises(InvalidInput, match=r"n: expected an integer in \[1, 256\], got 0"):
        generation_specs({"prompt": "w1", "n": 0}, "id", 0.0, 1.0)
