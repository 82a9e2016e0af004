"""The tiny policies of examples/lm/tiny_policy.py are what they claim to be.

Each directory loads with the libraries a user would load a TRL output with, was written by
the trainer it names, holds trained (not initial) weights, and its policy answers a chat
prompt with a sentence that ends with EOS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BatchEncoding,
    PreTrainedModel,
)

from examples.lm.tiny_policy import TinyPolicies

PROMPTS = (
    "Tell me about the cat.",
    "What does the train do?",
    "Describe the soup.",
    "Tell me about the piano.",
    "What does the rain do?",
)
MAX_NEW_TOKENS = 48
# name -> (architecture, trainer config written next to the weights, the base it was trained from)
TRAINED = {
    "llama_dpo": ("LlamaForCausalLM", "DPOConfig", "llama_base"),
    "qwen2_grpo": ("Qwen2ForCausalLM", "GRPOConfig", "qwen2_base"),
    "llama_grpo_lora": ("LlamaForCausalLM", "GRPOConfig", "llama_base"),
}
POLICIES = ("llama_base", "qwen2_base", *TRAINED)

# peft still asks transformers 5 the old name of activation checkpointing.
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models; the machine's other cores are busy
    yield
    torch.set_num_threads(previous)


def _load(policies: TinyPolicies, name: str) -> PreTrainedModel:
    """Load a policy as a user would: full weights directly, an adapter merged into its base."""
    path: Path = getattr(policies, name)
    if (path / "adapter_config.json").exists():
        base_dir = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
        base = AutoModelForCausalLM.from_pretrained(base_dir)
        merged: PreTrainedModel = PeftModel.from_pretrained(base, path).merge_and_unload()
        return merged
    return AutoModelForCausalLM.from_pretrained(path)


def _changed(trained: PreTrainedModel, base: PreTrainedModel) -> list[str]:
    base_state = base.state_dict()
    return [
        name
        for name, tensor in trained.state_dict().items()
        if not torch.equal(tensor, base_state[name])
    ]


@pytest.mark.parametrize("name", POLICIES)
def test_a_policy_loads_as_a_causal_lm_of_its_family(tiny_policies, name):
    model = _load(tiny_policies, name)
    family = name.split("_")[0]
    assert (
        type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]
    )
    config = model.config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
    # Like the real families: Llama 3 8B has its own head, Qwen2 0.5B ties it to the embedding.
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    assert head is not None
    tied = head.weight is embedding.weight
    assert tied == (family == "qwen2")
    tokenizer = AutoTokenizer.from_pretrained(getattr(tiny_policies, name))
    assert config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_the_lora_policy_is_a_peft_adapter_over_the_llama_base(tiny_policies):
    adapter = tiny_policies.llama_grpo_lora
    assert (adapter / "adapter_model.safetensors").is_file()
    assert not (adapter / "model.safetensors").exists()
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    assert Path(config["base_model_name_or_path"]).resolve() == tiny_policies.llama_base.resolve()


@pytest.mark.parametrize("name", TRAINED)
def test_a_trained_policy_was_written_by_its_trl_trainer(tiny_policies, name):
    path: Path = getattr(tiny_policies, name)
    trainer_config = TRAINED[name][1]
    # Trainer.save_model pickles its TrainingArguments: a DPOConfig or a GRPOConfig.
    arguments: Any = torch.load(path / "training_args.bin", weights_only=False)
    assert type(arguments).__name__ == trainer_config
    assert type(arguments).__module__.startswith("trl.")
    card = (path / "README.md").read_text()
    algorithm = trainer_config.removesuffix("Config").lower()
    assert "- trl\n" in card
    assert f"- {algorithm}\n" in card


@pytest.mark.parametrize("name", TRAINED)
def test_a_trained_policy_moved_away_from_its_base(tiny_policies, name):
    base = _load(tiny_policies, TRAINED[name][2])
    trained = _load(tiny_policies, name)
    changed = _changed(trained, base)
    # Full-weight training moves every layer; LoRA on the attention projections moves those.
    assert changed, f"{name} has the same weights as its base"
    if name.endswith("lora"):
        assert all("self_attn" in parameter for parameter in changed), changed
    else:
        assert any("mlp" in parameter for parameter in changed), changed


def test_the_llama_tokenizer_adds_bos_and_the_qwen2_one_does_not(tiny_policies):
    llama = AutoTokenizer.from_pretrained(tiny_policies.llama_dpo)
    qwen2 = AutoTokenizer.from_pretrained(tiny_policies.qwen2_grpo)
    text = "The cat sleeps in the garden."
    assert llama(text)["input_ids"][0] == llama.bos_token_id
    assert qwen2.bos_token_id not in qwen2(text)["input_ids"]
    # The same words either way: only the BOS differs.
    assert llama(text)["input_ids"][1:] == llama(text, add_special_tokens=False)["input_ids"]
    assert qwen2(text)["input_ids"] == qwen2(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", ["qwen2_base", "qwen2_grpo"])
def test_the_qwen2_vocabulary_holds_endoftext_as_real_qwen2_does(tiny_policies, name):
    """Qwen2Tokenizer takes <|endoftext|> for its unk token unless told otherwise: a load that
    does so must find it among the model's rows, not append it past them."""
    path = getattr(tiny_policies, name)
    vocab_size = AutoConfig.from_pretrained(path).vocab_size
    saved = AutoTokenizer.from_pretrained(path)
    defaulted = AutoTokenizer.from_pretrained(path, unk_token="<|endoftext|>")
    assert type(defaulted).__name__ == "Qwen2Tokenizer"
    assert saved.unk_token is None  # as real Qwen2's tokenizer_config.json says
    assert len(saved) == len(defaulted) == vocab_size
    assert defaulted.convert_tokens_to_ids("<|endoftext|>") < vocab_size
    assert "<|endoftext|>" in saved.all_special_tokens


@pytest.mark.parametrize("name", POLICIES)
def test_the_chat_template_renders_a_prompt_as_a_prefix_of_its_answer(tiny_policies, name):
    tokenizer = AutoTokenizer.from_pretrained(getattr(tiny_policies, name))
    question = [{"role": "user", "content": PROMPTS[0]}]
    answer = [{"role": "assistant", "content": "The cat sleeps."}]
    prompt = tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(question + answer, tokenize=False)
    assert isinstance(prompt, str)
    assert isinstance(whole, str)
    assert PROMPTS[0] in prompt
    assert whole.startswith(prompt)
    assert whole.endswith(f"The cat sleeps.{tokenizer.eos_token}\n")
    assert prompt.startswith(tokenizer.bos_token) == name.startswith("llama")
    # TRL's trainers split prompt and completion where the two token sequences part.
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    whole_ids = tokenizer(whole, add_special_tokens=False)["input_ids"]
    assert whole_ids[: len(prompt_ids)] == prompt_ids


@pytest.mark.parametrize("name", POLICIES)
def test_greedy_answers_end_with_eos(tiny_policies, name):
    # Any: transformers annotates generate() for a protocol its own models do not declare.
    model: Any = _load(tiny_policies, name)
    tokenizer = AutoTokenizer.from_pretrained(getattr(tiny_policies, name))
    ended = []
    for text in PROMPTS:
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        assert isinstance(inputs, BatchEncoding)
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        answer = output[0, inputs["input_ids"].shape[1] :].tolist()
        words = str(tokenizer.decode(answer, skip_special_tokens=True)).split()
        ended.append(tokenizer.eos_token_id in answer and len(words) >= 2)
    assert sum(ended) >= len(PROMPTS) - 1, ended
