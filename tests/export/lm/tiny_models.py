"""Tiny causal LMs made here in seconds, for what the TRL policies of ``tiny_policies`` do not
show (random weights; parity does not care how well a model writes): a Llama whose three EOS
sources disagree and whose generation config samples, a Qwen2 whose tokenizer adds nothing
and whose only trace of its trainer is ``training_args.bin`` (a pickled ``GRPOConfig``, as
transformers' Trainer saves it), and a GPT-2 the exporter must refuse.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS = (
    "the quick brown fox jumps over the lazy dog",
    "a policy maps what it observes to what it does next",
    "reinforcement learning from human feedback tunes a policy on preferences",
    "direct preference optimisation and group relative policy optimisation",
    "hello world, how are you today? numbers 0 1 2 3 4 5 6 7 8 9",
    "question: what does a reward model score? answer: a completion",
    "once upon a time the cat sat on the mat all afternoon",
)
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>", "<|eot|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyModels:
    llama: Path  # EOS: config </s>, generation config <|im_end|>, tokenizer <|eot|>; sampling
    qwen2: Path  # Qwen2ForCausalLM, tied head, no BOS, a GRPOConfig in training_args.bin
    gpt2: Path  # GPT2LMHeadModel: not supported


def make(root: Path) -> TinyModels:
    import torch

    torch.manual_seed(0)
    models = TinyModels(root / "llama", root / "qwen2", root / "gpt2")
    _llama(models.llama)
    _qwen2(models.qwen2)
    _gpt2(models.gpt2)
    return models


def orphan_adapter(adapter: Path, out: Path) -> Path:
    """A copy of a PEFT adapter directory whose recorded base is a directory that is gone."""
    shutil.copytree(adapter, out)
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(out.parent / "deleted-base")
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def tokenizer(*, bos: bool, eos: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(CORPUS) * 20, trainer=trainer)
    if bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A",
            pair="<s> $A <s> $B",
            special_tokens=[("<s>", backend.token_to_id("<s>"))],
        )
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>" if bos else None,
        eos_token=eos,
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
    )


def _shape(tok: Any) -> dict[str, Any]:
    return {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "pad_token_id": tok.pad_token_id,
    }


def _llama(out: Path) -> None:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = tokenizer(bos=True, eos="<|eot|>")
    ids = {name: tok.convert_tokens_to_ids(name) for name in SPECIALS}
    config = LlamaConfig(**_shape(tok), bos_token_id=ids["<s>"], eos_token_id=ids["</s>"])
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<s>"],
        eos_token_id=[ids["<|im_end|>"]],
        pad_token_id=ids["<pad>"],
        temperature=0.7,
        top_p=0.9,
        do_sample=True,
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _qwen2(out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig

    tok = tokenizer(bos=False, eos="<|im_end|>")
    config = Qwen2Config(**_shape(tok), eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    args = GRPOConfig(output_dir=str(out), report_to="none", use_cpu=True, bf16=False)
    torch.save(args, out / "training_args.bin")  # as transformers' Trainer saves its arguments


def _gpt2(out: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=100, eos_token_id=0, bos_token_id=0
    )
    GPT2LMHeadModel(config).save_pretrained(out)
