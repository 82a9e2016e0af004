"""The contract of a language-model policy (kind ``causal-lm``).

It lives where an actor-critic's does: JSON in the ONNX file's ``metadata_props`` under
``rlserve.policy`` (:data:`kernel.contract.METADATA_KEY`), same schema name, told apart by
``kind``. The exporter (``export/lm``) writes it; the server reads it, loads the tokenizer
files beside ``model.onnx`` and re-runs the golden prompts before serving the version.

The graph is a decoder with a key/value cache, one step at a time for any batch:

    inputs   input_ids        int64   [batch, sequence]
             attention_mask   int64   [batch, total]          total = past + sequence
             position_ids     int64   [batch, sequence]
             past_key_values.{i}.key / .value   float32 [batch, kv_heads, past, head_dim]
    outputs  logits           float32 [batch, sequence, vocab]
             present.{i}.key / .value           float32 [batch, kv_heads, total, head_dim]

``past`` may be 0 (a prefill). The names are in :class:`DecoderTensors` (the ``{i}`` is
the layer index). How rows of different lengths share a batch is the contract's
:class:`CacheLayout`:

- ``left_padded`` (the ``torch.onnx`` export, eager attention): a row's tokens are its last
  columns; ``attention_mask`` hides the padding before them and each row's
  ``position_ids`` count its real tokens only.
- ``sequence_lengths`` (onnxruntime's ``GroupQueryAttention`` graph, from
  onnxruntime-genai's model builder): a row's tokens are its *first* ``sum(mask)`` columns
  (right padding); the graph reads only each row's count of ones and the mask's width, and
  computes positions from them, so it has no ``position_ids`` input. A step writes each
  row's new key and value at its own length.

A version directory holds, beside ``model.onnx``, the tokenizer (:data:`TOKENIZER_FILE`,
loadable by ``tokenizers.Tokenizer.from_file``) and the source's ``tokenizer_config.json``
and ``generation_config.json`` as they were (for people; the server reads only the
contract and ``tokenizer.json``).

This module needs neither torch nor transformers.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.contract import SCHEMA, Algorithm, Exporter, _json_object
from kernel.errors import ContractError

__all__ = [
    "KIND",
    "SCHEMA",
    "TOKENIZER_FILE",
    "Adapter",
    "CacheLayout",
    "DecoderTensors",
    "GenerationDefaults",
    "GoldenPrompt",
    "LanguageModelContract",
    "LanguageModelSource",
    "PromptEncoding",
    "TokenSpace",
    "parse",
]

KIND = "causal-lm"
TOKENIZER_FILE = "tokenizer.json"
SIDE_FILES = ("tokenizer_config.json", "generation_config.json", "chat_template.jinja")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Adapter(_Model):
    """A PEFT adapter merged into its base before export."""

    kind: str  # "lora"
    path: str  # the adapter directory's name, as given
    sha256: str  # of the adapter's weights file
    base: str  # the base model directory's name
    base_sha256: str


class LanguageModelSource(_Model):
    framework: Literal["transformers"] = "transformers"
    framework_version: str
    architecture: str  # e.g. "LlamaForCausalLM", "Qwen2ForCausalLM"
    checkpoint: str  # the directory's name, as given
    sha256: str  # of the weights files (safetensors), in name order
    adapter: Adapter | None = None
    trainer: str | None = None  # e.g. "trl 1.16.0", when the directory says so


class CacheLayout(StrEnum):
    """Where a row's tokens sit in a batch's key/value cache (see the module docstring)."""

    LEFT_PADDED = "left_padded"
    SEQUENCE_LENGTHS = "sequence_lengths"


class DecoderTensors(_Model):
    """Graph tensor names; ``{i}`` in the cache names is the layer index."""

    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    position_ids: str | None = "position_ids"  # None: the graph computes positions
    logits: str = "logits"
    past_key: str = "past_key_values.{i}.key"
    past_value: str = "past_key_values.{i}.value"
    present_key: str = "present.{i}.key"
    present_value: str = "present.{i}.value"


class PromptEncoding(StrEnum):
    """How prompt text becomes token ids (recorded, never guessed at serving time)."""

    # tokenizer.json's post-processor adds what the source tokenizer adds (BOS for Llama,
    # nothing for Qwen2): what ``AutoTokenizer(...)(text)`` gives.
    WITH_SPECIAL_TOKENS = "with_special_tokens"
    PLAIN = "plain"  # encode(text, add_special_tokens=False)


class GenerationDefaults(_Model):
    """What a request gets when it does not say (from generation_config.json, else these)."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    do_sample: bool = False  # greedy unless the request sets a temperature > 0 and sampling


class GoldenPrompt(_Model):
    """A prompt's greedy continuation and the log-prob of each greedy token, computed by the
    source model in transformers at export: the server decodes the prompt greedily when it
    loads the version and must reproduce ``greedy_ids`` exactly and ``log_probs`` within
    ``golden_atol``."""

    prompt_ids: list[int]
    greedy_ids: list[int]  # the new tokens, an EOS included when generation stopped on one
    log_probs: list[float]  # log p(greedy_ids[k] | prompt + greedy_ids[:k]), natural log


class TokenSpace(_Model):
    """What a language model reads and writes: ids of its vocabulary's tokens."""

    kind: Literal["tokens"] = "tokens"
    vocab_size: int


class LanguageModelContract(_Model):
    schema_: Literal["rlserve.policy/v1"] = Field("rlserve.policy/v1", alias="schema")
    kind: Literal["causal-lm"] = "causal-lm"
    algorithm: Algorithm | None  # dpo or grpo when known; None for a plain causal LM
    source: LanguageModelSource
    vocab_size: int  # the logits' last dimension
    context_length: int  # max_position_embeddings: prompt + new tokens never exceed it
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: Literal["float32"] = "float32"
    tensors: DecoderTensors = Field(default_factory=DecoderTensors)
    cache_layout: CacheLayout = CacheLayout.LEFT_PADDED
    tokenizer_file: str = TOKENIZER_FILE
    prompt_encoding: PromptEncoding
    completion_encoding: PromptEncoding = PromptEncoding.PLAIN  # score: completions' ids
    bos_token_id: int | None
    pad_token_id: int | None
    eos_token_ids: list[int]  # the union of config, generation config and tokenizer
    special_tokens: dict[str, str] = Field(default_factory=dict)  # bos_token etc., for templates
    chat_template: str | None = None  # Jinja, as the tokenizer config had it
    generation_defaults: GenerationDefaults = Field(default_factory=GenerationDefaults)
    policy_version: int
    exporter: Exporter
    opset: int
    created_at: str  # ISO 8601, UTC
    golden: list[GoldenPrompt]
    golden_atol: float = 1e-4

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @property
    def observation_space(self) -> TokenSpace:
        """Tokens in: what the live-update check (``serve.control.updates``) compares, with
        ``action_space``, between a model's versions: they must share the vocabulary size."""
        return TokenSpace(vocab_size=self.vocab_size)

    @property
    def action_space(self) -> TokenSpace:
        """Tokens out (each generated token is an action of the policy)."""
        return TokenSpace(vocab_size=self.vocab_size)

    def cache_names(self, layer: int) -> tuple[str, str, str, str]:
        """(past key, past value, present key, present value) of one layer."""
        t = self.tensors
        return (
            t.past_key.format(i=layer),
            t.past_value.format(i=layer),
            t.present_key.format(i=layer),
            t.present_value.format(i=layer),
        )


def parse(text: str, origin: str) -> LanguageModelContract:
    """A language-model contract from its JSON text; ContractError names what is wrong."""
    raw = _json_object(text, origin)
    if raw.get("schema") != SCHEMA:
        raise ContractError(
            f"{origin}: policy contract schema {raw.get('schema')!r} is not supported; this "
            f"rlserve reads {SCHEMA!r} (re-export the model with this version of rlserve)"
        )
    try:
        return LanguageModelContract.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ContractError(
            f"{origin}: invalid language-model contract at {where}: {first['msg']}"
        ) from None
