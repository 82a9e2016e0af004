"""Text in and out: prompt encodings, chat templates, streaming detokenization, stops."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kernel.errors import InvalidInput, ModelLoadError
from serve.lm.text import Detokenizer, StopStrings, TextCodec
from tests.serve.lm import fakes


def test_a_prompt_is_encoded_as_the_contract_says():
    w1, w2 = fakes.word("w1"), fakes.word("w2")
    assert fakes.codec().encode_prompt("w1 w2") == [fakes.BOS, w1, w2]
    assert fakes.codec(prompt_encoding="plain").encode_prompt("w1 w2") == [w1, w2]
    assert fakes.codec().encode_completion("w1 w2") == [w1, w2]  # completions: plain


def test_a_chat_is_rendered_with_its_template_and_encoded_without_special_tokens():
    codec = fakes.codec()
    messages = [{"role": "system", "content": "w1"}, {"role": "user", "content": "w2 w3"}]
    text = codec.render_chat(messages)
    assert text == "<s>system w1 </s> user w2 w3 </s> assistant "
    ids = codec.encode_chat(messages)
    assert ids[0] == fakes.BOS
    assert ids.count(fakes.BOS) == 1
    assert ids[-1] == fakes.word("assistant")


def test_the_template_runs_sandboxed():
    codec = fakes.codec(chat_template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(InvalidInput, match="messages: the model's chat template refused"):
        codec.render_chat([{"role": "user", "content": "w1"}])


def test_a_template_can_raise_its_own_error():
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    codec = fakes.codec(chat_template=template)
    with pytest.raises(InvalidInput, match="user first"):
        codec.render_chat([{"role": "assistant", "content": "w1"}])


def test_no_template_no_chat():
    with pytest.raises(InvalidInput, match="no chat template"):
        fakes.codec(chat_template=None).render_chat([{"role": "user", "content": "w1"}])


def test_a_broken_template_fails_the_load():
    with pytest.raises(ModelLoadError, match="chat_template does not compile"):
        fakes.codec(chat_template="{% for %}")


def test_a_missing_tokenizer_fails_the_load(tmp_path):
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        TextCodec.load(tmp_path, fakes.contract(), "fake/1")


def byte_level(tmp_path) -> TextCodec:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(["héllo wörld, naïve café 😀 done"] * 20, trainer=trainer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return TextCodec.load(tmp_path, fakes.contract(vocab_size=300), "bytes/1")


def test_streamed_pieces_add_up_to_the_text_and_never_split_a_character(tmp_path):
    codec = byte_level(tmp_path)
    text = "naïve 😀 café, héllo"
    merged = codec.tokenizer.encode(text).ids
    # One token per byte: a character of several bytes arrives over several tokens.
    vocabulary = codec.tokenizer
    ids = [vocabulary.token_to_id(b) for i in merged for b in str(vocabulary.id_to_token(i))]
    assert None not in ids
    assert len(ids) > len(text)
    detokenizer = Detokenizer(codec)
    pieces = [detokenizer.push(i) for i in ids if i is not None]
    pieces.append(detokenizer.flush())
    assert "".join(pieces) == codec.decode([i for i in ids if i is not None]) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_stop_strings_are_found_across_pieces_and_their_starts_held_back():
    stops = StopStrings(["END", "\n\n"])
    assert stops.find("abc E") is None
    assert stops.safe("abc E") == 4
    assert stops.safe("abc EN") == 4
    assert stops.safe("abc \n") == 4
    assert stops.find("abc ENDx") == 4
    assert StopStrings(["xy"]).safe("aaa") == 3
