"""The prompts parity runs on, and what the source model says about them in transformers.

Prompts are made from the tokenizer: plain text and, when the tokenizer has a chat
template, chat conversations rendered by it, alternating, of uneven lengths (equal lengths
hide a wrong mask or wrong positions in a padded batch). Each prompt carries a given
completion for scoring. The reference is ``transformers.generate`` (greedy, the contract's
EOS set, no logits processor) and one forward pass over prompt + completion.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from export.errors import ExportError
from export.lm import vocabulary
from kernel.lm.contract import PromptEncoding

_TEXTS = (
    "The",
    "Once upon a time",
    "A policy maps what it observes to what it does next.",
    "Write one sentence about the sea",
    "Numbers: 3, 1, 4, 1, 5, 9, 2, 6",
    "The quick brown fox jumps over the lazy dog, and then the dog wakes up and",
    "Question: what does a reward model score? Answer:",
    "In reinforcement learning from human feedback, preference pairs are collected, a "
    "policy is tuned on them, and the tuned policy is then",
    "hello",
    "def add(a, b):\n    return",
)
_CHATS = (
    ({"role": "user", "content": "Hi!"},),
    (
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ),
    ({"role": "user", "content": "Name three colours of the rainbow, please, in order."},),
    (
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And times three?"},
    ),
    ({"role": "user", "content": "Summarise: the cat sat on the mat all afternoon."},),
    (
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Translate 'good morning' into French and German."},
    ),
)
_COMPLETIONS = (
    " and that was the end of it.",
    " yes",
    " The answer depends on what was observed before, and on the policy.",
    " 42",
    " Sure, here it is:",
)


class PromptKind(StrEnum):
    TEXT = "text"
    CHAT = "chat"


@dataclass(frozen=True)
class Prompt:
    kind: PromptKind
    text: str  # the text that was encoded (a chat: as the template rendered it)
    add_special_tokens: bool  # how ``text`` was encoded
    ids: list[int]
    completion_text: str
    completion_ids: list[int]  # encoded plain, an EOS appended to every other one


@dataclass(frozen=True)
class Reference:
    """The source model's answers for one prompt."""

    greedy_ids: list[int]  # new tokens; an EOS included when generation stopped on one
    greedy_log_probs: list[float]
    completion_log_probs: list[float]


def prompts(
    tokenizer: Any, encoding: PromptEncoding, count: int, room: int, eos: int, context: int
) -> list[Prompt]:
    """``count`` prompts of at most ``room`` tokens, text and chat alternating; a completion
    is cut where prompt and completion would pass ``context`` tokens."""
    chat = vocabulary.chat_template(tokenizer) is not None
    made: list[Prompt] = []
    for index in range(count):
        completion = _completion(tokenizer, index, eos)
        if chat and index % 2 == 1:
            made.append(_chat(tokenizer, index // 2, completion))
        else:
            made.append(_text(tokenizer, encoding, index // 2 if chat else index, completion))
    return [_fitted(p, room, context) for p in made]


def _completion(tokenizer: Any, index: int, eos: int) -> tuple[str, list[int]]:
    text = _COMPLETIONS[index % len(_COMPLETIONS)]
    ids = vocabulary.encode(tokenizer, text, PromptEncoding.PLAIN)
    return text, [*ids, eos] if index % 2 == 0 else ids


def _text(
    tokenizer: Any, encoding: PromptEncoding, n: int, completion: tuple[str, list[int]]
) -> Prompt:
    repeats = n // len(_TEXTS) + 1  # past the end of the list: longer prompts
    text = " ".join([_TEXTS[n % len(_TEXTS)]] * repeats)
    ids = vocabulary.encode(tokenizer, text, encoding)
    special = encoding is PromptEncoding.WITH_SPECIAL_TOKENS
    return Prompt(PromptKind.TEXT, text, special, ids, *completion)


def _chat(tokenizer: Any, n: int, completion: tuple[str, list[int]]) -> Prompt:
    messages = [dict(m) for m in _CHATS[n % len(_CHATS)]]
    messages[-1]["content"] = " ".join([messages[-1]["content"]] * (n // len(_CHATS) + 1))
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    ids = [int(i) for i in encoded["input_ids"]]  # the text, encoded without special tokens
    return Prompt(PromptKind.CHAT, text, False, ids, *completion)


def _fitted(prompt: Prompt, room: int, context: int) -> Prompt:
    if not prompt.ids:
        raise ExportError(f"the tokenizer encodes the prompt {prompt.text!r} to no tokens at all")
    ids = prompt.ids[:room]
    completion = prompt.completion_ids[: context - len(ids)]
    if (ids, completion) == (prompt.ids, prompt.completion_ids):
        return prompt
    return replace(prompt, ids=ids, completion_ids=completion)


def reference(model: Any, prompt: Prompt, eos: list[int], pad: int, new_tokens: int) -> Reference:
    """transformers' greedy continuation and log-probs, and its scores of the completion."""
    import torch
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    ids = torch.tensor([prompt.ids], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            num_beams=1,
            return_dict_in_generate=True,
            output_logits=True,
        )
    greedy = [int(t) for t in out.sequences[0, len(prompt.ids) :]]
    steps = torch.stack([logits[0] for logits in out.logits]).double().log_softmax(-1)
    greedy_log_probs = [float(steps[k, t]) for k, t in enumerate(greedy)]
    return Reference(greedy, greedy_log_probs, score(model, prompt.ids, prompt.completion_ids))


def score(model: Any, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """log p(completion[k] | prompt + completion[:k]) from one forward pass, float64."""
    import torch

    tokens = torch.tensor([[*prompt_ids, *completion_ids]], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits[0]
    predicting = logits[len(prompt_ids) - 1 : -1].double().log_softmax(-1)
    return [float(predicting[k, t]) for k, t in enumerate(completion_ids)]
