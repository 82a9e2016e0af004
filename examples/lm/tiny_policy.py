"""Tiny language-model policies trained here, in about half a minute on one CPU core.

Nothing can be downloaded from a model hub, so the tests and the benchmark of the language-model
policies (issue #12) build their own: a byte-level BPE tokenizer trained on a synthetic
English-like corpus, two tiny base models (a Llama and a Qwen2, the two families issue #12
names) pretrained on the same corpus until they write short sentences and stop with EOS, and
then three genuine TRL runs on top of them, saved the way TRL saves them:

- ``llama_dpo``: ``trl.DPOTrainer`` on the Llama base, full weights;
- ``qwen2_grpo``: ``trl.GRPOTrainer`` on the Qwen2 base, full weights;
- ``llama_grpo_lora``: ``trl.GRPOTrainer`` with a ``peft.LoraConfig`` on the Llama base, saved
  as a PEFT adapter directory whose base is ``llama_base``.

The two tokenizer flavours behave like the real families: the Llama one adds BOS when it
encodes, the Qwen2 one does not. Both carry a small chat template (``<|user|>`` ...).

Read top to bottom: the corpus, the tokenizer, the base models, the TRL runs, the whole recipe.

    .venv/bin/python examples/lm/tiny_policy.py OUT_DIR [--seed 0] [--threads 1]

The build is deterministic (the same seed gives the same bytes) and never touches a hub. The
adapter names its base by absolute path, as TRL writes it, so move nothing out of the root; a
manifest (tiny_policies.json), written last, says a build is complete. Heavy
libraries (torch, transformers, TRL) are imported inside the functions, so that importing this
module or ``--help`` costs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from datasets import Dataset
    from peft import LoraConfig
    from tokenizers import Tokenizer
    from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, Trainer
    from trl import DPOTrainer, GRPOTrainer

Arch = Literal["llama", "qwen2"]

# Bump when the recipe changes, so that a reused fixture directory is rebuilt.
# 2: the Qwen2 flavour's vocabulary holds <|endoftext|>.
# 3: two heads of 32 dimensions (one key/value head) instead of four of 16: vLLM's CPU
#    attention, a peer in the benchmark, needs a head dimension of at least 32.
RECIPE_VERSION = 3
MANIFEST = "tiny_policies.json"

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Real Qwen2 vocabularies hold <|endoftext|>, and Qwen2Tokenizer names it as its unk token
# whenever tokenizer_config.json does not say otherwise: without it in the vocabulary, such a
# load appends it past the model's embeddings.
QWEN2_TOKENS = ("<|endoftext|>",)
VOCAB_SIZE = 768
MAX_LENGTH = 48  # tokens of prompt + completion in every training step
COMPLETION_LENGTH = 24  # tokens GRPO samples per completion

# The template renders every turn as ``<|role|>\ncontent</s>\n``: the turn ends with EOS, as
# Qwen2's ``<|im_end|>`` does, so a policy stops at the end of its answer. Rendering the prompt
# alone with the generation prompt gives a prefix of the prompt rendered with an answer.
CHAT_TURNS = (
    "{%- for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def chat_template(flavour: Arch) -> str:
    """The Llama flavour's template starts with BOS (as Llama 3's does); Qwen2's has none."""
    return ("{{- bos_token }}" if flavour == "llama" else "") + CHAT_TURNS


# -- the synthetic corpus ---------------------------------------------------------------------


@dataclass(frozen=True)
class Topic:
    nouns: tuple[str, ...]
    verbs: tuple[str, ...]
    places: tuple[str, ...]
    adjectives: tuple[str, ...]


TOPICS: dict[str, Topic] = {
    "animals": Topic(
        ("cat", "dog", "bird", "horse", "fox"),
        ("sleeps", "runs", "sings", "eats", "waits"),
        ("in the garden", "near the river", "under the tree", "on the hill", "by the barn"),
        ("small", "old", "happy", "quiet"),
    ),
    "weather": Topic(
        ("sun", "rain", "wind", "snow", "cloud"),
        ("shines", "falls", "blows", "melts", "moves"),
        ("over the town", "on the roof", "across the field", "above the sea", "in the valley"),
        ("bright", "cold", "soft", "dark"),
    ),
    "food": Topic(
        ("bread", "soup", "apple", "cake", "tea"),
        ("cools", "waits", "sits", "warms", "rests"),
        ("on the table", "in the kitchen", "by the window", "in the basket", "at the market"),
        ("fresh", "hot", "sweet", "green"),
    ),
    "travel": Topic(
        ("train", "boat", "car", "plane", "bus"),
        ("leaves", "arrives", "stops", "turns", "moves"),
        ("at the station", "near the coast", "on the road", "over the bridge", "in the city"),
        ("fast", "red", "late", "full"),
    ),
    "music": Topic(
        ("band", "song", "piano", "drum", "choir"),
        ("plays", "starts", "ends", "rings", "sounds"),
        ("in the hall", "at the party", "in the church", "on the radio", "at school"),
        ("loud", "new", "slow", "gentle"),
    ),
}
TIMES = ("in the morning", "at night", "after lunch", "every day", "in the evening")
QUESTIONS = ("Tell me about the {noun}.", "What does the {noun} do?", "Describe the {noun}.")


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _clause(rng: random.Random, topic: Topic, noun: str) -> str:
    verb, place = rng.choice(topic.verbs), rng.choice(topic.places)
    form = rng.randrange(4)
    if form == 0:
        return f"the {rng.choice(topic.adjectives)} {noun} {verb} {place}"
    if form == 1:
        return f"the {noun} {verb} {place} {rng.choice(TIMES)}"
    if form == 2:
        return f"the {noun} is {rng.choice(topic.adjectives)}"
    return f"the {noun} {verb} {place}"


def all_nouns() -> list[str]:
    return [noun for topic in TOPICS.values() for noun in topic.nouns]


def _topic_of(noun: str) -> Topic:
    return next(topic for topic in TOPICS.values() if noun in topic.nouns)


def sentence(rng: random.Random, *, noun: str | None = None, clauses: int = 1) -> str:
    """One sentence of the synthetic language; its first clause is about ``noun`` if given."""
    parts: list[str] = []
    for index in range(clauses):
        subject = noun if index == 0 and noun is not None else rng.choice(all_nouns())
        parts.append(_clause(rng, _topic_of(subject), subject))
    return _capitalised(" and ".join(parts)) + "."


def question(rng: random.Random, noun: str) -> str:
    return rng.choice(QUESTIONS).format(noun=noun)


def corpus(*, lines: int = 3000, seed: int = 0) -> list[str]:
    """Plain sentences (mostly one clause, some two) and the questions of the chat turns."""
    rng = random.Random(seed)
    text = [sentence(rng, clauses=1 if rng.random() < 0.8 else 2) for _ in range(lines)]
    text += [question(rng, noun) for noun in all_nouns() for _ in range(len(QUESTIONS))]
    return text


def conversation(rng: random.Random) -> list[dict[str, str]]:
    """A one-turn chat: a question about a noun and a one-sentence answer about it."""
    noun = rng.choice(all_nouns())
    return [
        {"role": "user", "content": question(rng, noun)},
        {"role": "assistant", "content": sentence(rng, noun=noun)},
    ]


# -- the process: no hub, quiet, a fixed number of threads ------------------------------------


OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}


@contextlib.contextmanager
def _environment(settings: dict[str, str]) -> Iterator[None]:
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def quiet_offline(*, threads: int) -> Iterator[None]:
    """No hub, no experiment trackers, no progress bars, ``threads`` torch threads.

    The hub libraries read their offline switch when first imported: in a process that has not
    imported them yet this switches them off; every path this recipe passes is local anyway.
    One thread by default: these models are so small that a second thread gains little, and on
    a machine whose other cores are busy a second thread waiting on them costs a lot.
    """
    with _environment(OFFLINE), warnings.catch_warnings():
        # transformers 5 renamed gradient to activation checkpointing; TRL still reads the old name.
        warnings.filterwarnings("ignore", message=".*removed in v6.*", category=FutureWarning)
        import datasets
        import torch
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
        verbosity = transformers.utils.logging.get_verbosity()
        transformers.utils.logging.set_verbosity_error()
        threads_before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(threads_before)
            transformers.utils.logging.set_verbosity(verbosity)


def _progress(message: str) -> None:
    print(f"[tiny_policy] {message}", file=sys.stderr, flush=True)


# -- the tokenizer ----------------------------------------------------------------------------


def _family_tokens(flavour: Arch) -> tuple[str, ...]:
    """The special tokens of one family beyond the shared ones; they come last, so the
    shared ones have the same ids in both flavours."""
    return QWEN2_TOKENS if flavour == "qwen2" else ()


def _trained_bpe(flavour: Arch, *, seed: int) -> Tokenizer:
    """Byte-level BPE on the corpus, split into words the way the family's tokenizer splits."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tokenizer = Tokenizer(models.BPE())
    if flavour == "llama":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:  # what Qwen2Tokenizer rebuilds when transformers loads a qwen2 model's tokenizer
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS, *_family_tokens(flavour)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed=seed), trainer=trainer)
    return tokenizer


def train_tokenizer(out: Path, *, flavour: Arch = "llama", seed: int = 0) -> Path:
    """Train a byte-level BPE tokenizer on the corpus and save it as a transformers tokenizer.

    Special tokens: ``<s>`` (BOS), ``</s>`` (EOS, also the end of every chat turn), ``<pad>``,
    one token per chat role and, in the Qwen2 flavour, ``<|endoftext|>``; the chat template
    goes to chat_template.jinja.

    ``flavour="llama"`` is a ``PreTrainedTokenizerFast`` that adds BOS when encoding (a
    post-processor in tokenizer.json) and whose chat template starts with BOS, as Llama 3's
    does. ``flavour="qwen2"`` is a ``Qwen2Tokenizer`` (transformers loads every qwen2 model's
    tokenizer as one, rebuilding it from the vocabulary) and adds no BOS anywhere.
    """
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    bpe = _trained_bpe(flavour, seed=seed)
    common: dict[str, Any] = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "extra_special_tokens": [*ROLE_TOKENS, *_family_tokens(flavour)],
        "chat_template": chat_template(flavour),
        "model_max_length": 256,
    }
    if flavour == "llama":
        from tokenizers import processors

        bos = (BOS, bpe.token_to_id(BOS))
        adds_bos = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[bos]
        )
        bpe.post_processor = processors.Sequence(
            [processors.ByteLevel(trim_offsets=False), adds_bos]
        )
        wrapped: PreTrainedTokenizerBase = PreTrainedTokenizerFast(
            tokenizer_object=bpe, clean_up_tokenization_spaces=False, **common
        )
    else:
        learned = json.loads(bpe.to_str())["model"]
        # Its annotations say str for both; the constructor takes merge pairs and no unk_token.
        vocabulary: dict[str, Any] = {
            "vocab": learned["vocab"],
            "merges": [tuple(pair) for pair in learned["merges"]],
            "unk_token": None,  # as real Qwen2 says; a load that misses it finds <|endoftext|>
        }
        wrapped = Qwen2Tokenizer(**vocabulary, **common)
    wrapped.save_pretrained(out)
    return out


# -- the base models --------------------------------------------------------------------------


def _config(arch: Arch, tokenizer: PreTrainedTokenizerBase) -> PreTrainedConfig:
    from transformers import LlamaConfig, Qwen2Config

    shape: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,  # heads of 32 dimensions: vLLM's CPU attention needs 32
        "num_key_value_heads": 1,  # grouped-query attention, as both real families use
        "intermediate_size": 128,
        "max_position_embeddings": 256,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if arch == "llama":  # as Llama 3 8B: an untied head
        return LlamaConfig(
            **shape, tie_word_embeddings=False, rms_norm_eps=1e-5, rope_parameters=_rope(500_000.0)
        )
    # as Qwen2 0.5B: a tied head (and the family's q/k/v biases)
    return Qwen2Config(
        **shape, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_parameters=_rope(1_000_000.0)
    )


def _rope(theta: float) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta}


def _pretraining_examples(
    tokenizer: PreTrainedTokenizerBase, *, count: int, seed: int
) -> list[list[int]]:
    """Plain sentences ending in EOS and chats rendered by the chat template, half and half.

    A plain sentence gets the tokenizer's own special tokens (BOS for the Llama flavour); a
    rendered chat already holds what its template puts there.
    """
    rng = random.Random(seed + 1)
    examples: list[list[int]] = []
    for _ in range(count):
        if rng.random() < 0.5:
            text = sentence(rng, clauses=1 if rng.random() < 0.8 else 2) + EOS
            ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        else:
            chat = str(tokenizer.apply_chat_template(conversation(rng), tokenize=False))
            ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
        examples.append(list(ids[:MAX_LENGTH]))
    return examples


def _batch(examples: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    """Right-padded input ids and labels (padding ignored by the loss)."""
    import torch

    width = max(len(ids) for ids in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, ids in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(ids)
    return input_ids, labels


def _pretrain(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, steps: int, seed: int
) -> float:
    """A plain causal-LM loop with a linear decay; returns the last batch's loss."""
    import torch

    batch_size = 16
    examples = _pretraining_examples(tokenizer, count=steps * batch_size, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        rows = examples[step * batch_size : (step + 1) * batch_size]
        input_ids, labels = _batch(rows, tokenizer.pad_token_id)
        loss = model(input_ids=input_ids, attention_mask=labels != -100, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return float(loss.detach())


def base_model(arch: Arch, tokenizer_dir: Path, out: Path, *, seed: int, steps: int = 500) -> Path:
    """A tiny ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` pretrained on the synthetic corpus."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(arch, tokenizer))
    loss = _pretrain(model, tokenizer, steps=steps, seed=seed)
    _progress(f"{arch} base: {steps} pretraining steps, last loss {loss:.3f}")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=MAX_LENGTH,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# -- the TRL runs -----------------------------------------------------------------------------


def _common_args(out: Path, *, steps: int, seed: int) -> dict[str, Any]:
    """Training arguments shared by both trainers: CPU, fp32, quiet, nothing saved mid-run."""
    return {
        "output_dir": str(out),
        "max_steps": steps,
        "seed": seed,
        "use_cpu": True,
        "bf16": False,  # TRL's configs default to bf16
        "activation_checkpointing": False,  # TRL's configs default to True; tiny models need none
        "report_to": "none",
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
        "dataloader_pin_memory": False,
        "lr_scheduler_type": "constant",
        "push_to_hub": False,
    }


def _lora() -> LoraConfig:
    from peft import LoraConfig

    return LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )


def _train(trainer: Trainer, out: Path) -> None:
    """Train without the trainer printing its metrics to stdout; report them on stderr."""
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    result = trainer.train()
    steps = trainer.state.global_step
    _progress(
        f"{type(trainer).__name__} {out.name}: {steps} steps, loss {result.training_loss:.3f}"
    )


def _save(trainer: DPOTrainer | GRPOTrainer, out: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """What a TRL script does at the end: the model (or adapter), the tokenizer, the card."""
    trainer.save_model(str(out))
    tokenizer.save_pretrained(out)
    trainer.create_model_card(model_name=out.name)  # TRL writes it with checkpoints only


def preference_dataset(*, rows: int, seed: int) -> Dataset:
    """Conversational preferences: an answer about the noun asked about over one about another."""
    from datasets import Dataset

    rng = random.Random(seed + 2)
    records = []
    for _ in range(rows):
        noun = rng.choice(all_nouns())
        other = rng.choice([n for n in all_nouns() if n != noun])
        records.append(
            {
                "prompt": [{"role": "user", "content": question(rng, noun)}],
                "chosen": [{"role": "assistant", "content": sentence(rng, noun=noun)}],
                "rejected": [{"role": "assistant", "content": sentence(rng, noun=other)}],
            }
        )
    return Dataset.from_list(records)


def dpo_policy(
    base_dir: Path, out: Path, *, lora: bool = False, steps: int = 24, seed: int = 0
) -> Path:
    """``trl.DPOTrainer`` on ``base_dir``; full weights, or a LoRA adapter with ``lora=True``."""
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    args = DPOConfig(
        **_common_args(out, steps=steps, seed=seed),
        per_device_train_batch_size=8,
        learning_rate=5e-4 if lora else 1e-4,
        beta=0.1,
        max_length=MAX_LENGTH,
    )
    trainer = DPOTrainer(
        model=str(base_dir.resolve()),
        args=args,
        train_dataset=preference_dataset(rows=steps * 8, seed=seed),
        processing_class=tokenizer,
        peft_config=_lora() if lora else None,
    )
    _train(trainer, out)
    _save(trainer, out, tokenizer)
    return out


def prompt_dataset(*, rows: int, seed: int) -> Dataset:
    """Conversational prompts, each with the noun it asks about (the reward reads it)."""
    from datasets import Dataset

    rng = random.Random(seed + 3)
    records = []
    for _ in range(rows):
        noun = rng.choice(all_nouns())
        records.append({"prompt": [{"role": "user", "content": question(rng, noun)}], "noun": noun})
    return Dataset.from_list(records)


def on_topic_and_short(
    prompts: Sequence[Any], completions: Sequence[Any], noun: Sequence[str], **_: Any
) -> list[float | None]:
    """The GRPO reward: 1 for an answer naming the noun asked about, less 0.1 a word over 8."""
    rewards: list[float | None] = []
    for completion, asked in zip(completions, noun, strict=True):
        text = completion[0]["content"] if isinstance(completion, list) else str(completion)
        words = text.split()
        named = asked in (word.strip(".,").lower() for word in words)
        rewards.append(float(named) - 0.1 * max(0, len(words) - 8))
    return rewards


def grpo_policy(
    base_dir: Path, out: Path, *, lora: bool = False, steps: int = 16, seed: int = 0
) -> Path:
    """``trl.GRPOTrainer`` (transformers generation, no vLLM) on ``base_dir``."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    args = GRPOConfig(
        **_common_args(out, steps=steps, seed=seed),
        per_device_train_batch_size=8,
        num_generations=4,  # two prompts of four completions per step
        max_completion_length=COMPLETION_LENGTH,
        learning_rate=5e-4 if lora else 1e-4,
        beta=0.0,
    )
    trainer = GRPOTrainer(
        model=str(base_dir.resolve()),
        reward_funcs=on_topic_and_short,
        args=args,
        train_dataset=prompt_dataset(rows=steps * 2, seed=seed),
        processing_class=tokenizer,
        peft_config=_lora() if lora else None,
    )
    _train(trainer, out)
    _save(trainer, out, tokenizer)
    return out


# -- the whole recipe -------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyPolicies:
    """The directories ``make_policies`` writes, all under one root."""

    llama_base: Path  # pretrained here; the base of the two Llama runs
    qwen2_base: Path  # pretrained here; the base of the Qwen2 run
    llama_dpo: Path  # DPOTrainer, full weights
    qwen2_grpo: Path  # GRPOTrainer, full weights
    llama_grpo_lora: Path  # GRPOTrainer with LoRA: a PEFT adapter directory over llama_base

    @classmethod
    def under(cls, root: Path) -> TinyPolicies:
        return cls(
            llama_base=root / "llama-base",
            qwen2_base=root / "qwen2-base",
            llama_dpo=root / "llama-dpo",
            qwen2_grpo=root / "qwen2-grpo",
            llama_grpo_lora=root / "llama-grpo-lora",
        )


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    names = ("torch", "transformers", "trl", "peft", "tokenizers")
    return {name: version(name) for name in names}


def existing_policies(root: Path, *, seed: int = 0) -> TinyPolicies | None:
    """The policies under ``root`` if it holds a complete build of this recipe, seed and
    library versions; else None."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    current = (
        manifest.get("recipe") == RECIPE_VERSION
        and manifest.get("seed") == seed
        and manifest.get("versions") == _versions()
    )
    return TinyPolicies.under(root) if current else None


def make_policies(root: Path, *, seed: int = 0, threads: int = 1) -> TinyPolicies:
    """Build every tiny policy under ``root`` (tokenizers, bases, three TRL runs).

    The manifest that ``existing_policies`` reads is written last, once everything is there.
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).unlink(missing_ok=True)
    policies = TinyPolicies.under(root)
    started = time.perf_counter()
    with quiet_offline(threads=threads):
        llama_tokenizer = train_tokenizer(root / "tokenizer-llama", flavour="llama", seed=seed)
        qwen2_tokenizer = train_tokenizer(root / "tokenizer-qwen2", flavour="qwen2", seed=seed)
        base_model("llama", llama_tokenizer, policies.llama_base, seed=seed)
        base_model("qwen2", qwen2_tokenizer, policies.qwen2_base, seed=seed)
        dpo_policy(policies.llama_base, policies.llama_dpo, seed=seed)
        grpo_policy(policies.qwen2_base, policies.qwen2_grpo, seed=seed)
        grpo_policy(policies.llama_base, policies.llama_grpo_lora, lora=True, seed=seed)
    elapsed = time.perf_counter() - started
    manifest = {
        "recipe": RECIPE_VERSION,
        "versions": _versions(),
        "seed": seed,
        "seconds": round(elapsed, 1),
        "policies": {name: str(path) for name, path in asdict(policies).items()},
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    _progress(f"all policies in {elapsed:.1f} s under {root}")
    return policies


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="directory to write the policies under")
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpus and every run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    policies = make_policies(args.out, seed=args.seed, threads=args.threads)
    print(json.dumps({name: str(path) for name, path in asdict(policies).items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
