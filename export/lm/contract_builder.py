"""The ``causal-lm`` contract of an export: everything but the golden prompts is known before
parity runs (parity decodes with it); the golden prompts are added once parity passed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, cast

from export.lm import generation, vocabulary
from export.lm.eos import eos_token_ids
from export.lm.golden import Prompt, PromptKind, Reference
from export.lm.graph import CacheShape
from export.lm.source import CausalLM
from kernel import __version__
from kernel.contract import Exporter
from kernel.lm.contract import (
    SCHEMA,
    CacheLayout,
    DecoderTensors,
    GoldenPrompt,
    LanguageModelContract,
)


def draft(
    source: CausalLM,
    *,
    version: int,
    opset: int,
    atol: float,
    tensors: DecoderTensors,
    cache_layout: CacheLayout,
) -> LanguageModelContract:
    config = source.config
    tokenizer = source.tokenizer
    vocab_size = int(source.model.get_output_embeddings().weight.shape[0])
    shape = CacheShape.of(config)
    return LanguageModelContract(
        schema=cast(Literal["rlserve.policy/v1"], SCHEMA),  # the field's only value
        algorithm=source.algorithm,
        source=source.provenance,
        vocab_size=vocab_size,
        context_length=int(config.max_position_embeddings),
        num_layers=shape.num_layers,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        tensors=tensors,
        cache_layout=cache_layout,
        prompt_encoding=vocabulary.prompt_encoding(tokenizer),
        bos_token_id=_first(tokenizer.bos_token_id, config.bos_token_id),
        pad_token_id=_first(
            tokenizer.pad_token_id, config.pad_token_id, source.generation.get("pad_token_id")
        ),
        eos_token_ids=eos_token_ids(
            source.checkpoint.model.config, source.generation, tokenizer.eos_token_id, vocab_size
        ),
        special_tokens=vocabulary.special_tokens(tokenizer),
        chat_template=vocabulary.chat_template(tokenizer),
        generation_defaults=generation.defaults(source.generation),
        policy_version=version,
        exporter=Exporter(version=__version__),
        opset=opset,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        golden=[],
        golden_atol=atol,
    )


def with_golden(
    contract: LanguageModelContract, prompts: list[Prompt], references: list[Reference], count: int
) -> LanguageModelContract:
    """The contract with ``count`` golden prompts, taken from both kinds in turn."""
    chosen = _spread(list(zip(prompts, references, strict=True)), count)
    golden = [
        GoldenPrompt(
            prompt_ids=prompt.ids,
            greedy_ids=reference.greedy_ids,
            log_probs=reference.greedy_log_probs,
        )
        for prompt, reference in chosen
    ]
    return contract.model_copy(update={"golden": golden})


def _spread(pairs: list[tuple[Prompt, Reference]], count: int) -> list[tuple[Prompt, Reference]]:
    kinds = [[p for p in pairs if p[0].kind is kind] for kind in PromptKind]
    chosen: list[tuple[Prompt, Reference]] = []
    while len(chosen) < min(count, len(pairs)):
        for group in kinds:
            if group and len(chosen) < count:
                chosen.append(group.pop(0))
    return chosen


def _first(*values: object) -> int | None:
    return next((int(v) for v in values if isinstance(v, int) and not isinstance(v, bool)), None)
