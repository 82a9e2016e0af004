"""``rlserve inspect MODEL.onnx``: print the policy contract embedded in a model, an
actor-critic's or a language model's (``causal-lm``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from cli.arguments import add_arguments as add_dataclass_arguments
from cli.arguments import arg, from_namespace
from kernel import contract
from kernel.lm import contract as lm_contract

NAME = "inspect"
HELP = "print the policy contract embedded in an exported model (actor-critic or language model)"
EXTRA = None


@dataclass
class InspectArgs:
    model: Path = field(metadata=arg("the model.onnx to read", positional=True))
    json: bool = field(default=False, metadata=arg("print the contract as JSON"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, InspectArgs)


def run(namespace: argparse.Namespace) -> int:
    args = from_namespace(InspectArgs, namespace)
    policy = read(args.model)
    if args.json:
        print(json.dumps(json.loads(policy.to_json()), indent=2))
    elif isinstance(policy, lm_contract.LanguageModelContract):
        print(lm_summary(policy))
    else:
        print(summary(policy))
    return 0


def read(path: Path) -> contract.PolicyContract | lm_contract.LanguageModelContract:
    """The contract of a model file, of whichever kind it is."""
    metadata = contract.read_metadata(path)
    if contract.kind_of(metadata) == lm_contract.KIND:
        return lm_contract.parse(metadata[contract.METADATA_KEY], str(path))
    return contract.from_metadata(metadata, str(path))


def summary(policy: contract.PolicyContract) -> str:
    src = policy.source
    prep = policy.preprocessing
    norm = prep.normalization
    lines = [
        f"schema          {contract.SCHEMA}",
        f"algorithm       {policy.algorithm.value} ({policy.kind})",
        f"policy version  {policy.policy_version}",
        f"source          {src.framework} {src.framework_version}, {src.policy_class}",
        f"checkpoint      {src.checkpoint} sha256:{src.sha256}",
        f"exporter        {policy.exporter.name} {policy.exporter.version}, opset {policy.opset}",
        f"created         {policy.created_at}",
        f"observations    {policy.observation_space.model_dump_json()}",
        f"actions         {policy.action_space.model_dump_json()}",
        f"distribution    {policy.distribution.kind.value}",
        "normalisation   "
        + (f"baked in (clip {norm.clip}, eps {norm.epsilon:g})" if norm else "none"),
        "images          "
        + (", ".join(f"{i.key or 'obs'}: {i.layout} x{i.scale:g}" for i in prep.images) or "none"),
        f"action clip     {'baked in' if prep.action_clip else 'none'}",
        "inputs",
        *(f"  {t.name:<14}{t.role.value:<13}{t.dtype:<9}{t.shape}" for t in policy.inputs),
        "outputs",
        *(f"  {t.name:<14}{t.role.value:<13}{t.dtype:<9}{t.shape}" for t in policy.outputs),
        f"golden vectors  {len(policy.golden)} (atol {policy.golden_atol:g})",
    ]
    return "\n".join(lines)


def lm_summary(policy: lm_contract.LanguageModelContract) -> str:
    src = policy.source
    adapter = src.adapter
    t = policy.tensors
    gen = policy.generation_defaults
    template = policy.chat_template
    algorithm = policy.algorithm.value if policy.algorithm is not None else "none"
    lines = [
        f"schema          {contract.SCHEMA}",
        f"algorithm       {algorithm} ({policy.kind})",
        f"policy version  {policy.policy_version}",
        f"source          {src.framework} {src.framework_version}, {src.architecture}",
        f"checkpoint      {src.checkpoint} sha256:{src.sha256}",
        "adapter         "
        + (
            f"{adapter.kind} {adapter.path} sha256:{adapter.sha256}, merged into {adapter.base} "
            f"sha256:{adapter.base_sha256}"
            if adapter
            else "none"
        ),
        f"trainer         {src.trainer or 'unknown'}",
        f"exporter        {policy.exporter.name} {policy.exporter.version}, opset {policy.opset}",
        f"created         {policy.created_at}",
        f"vocabulary      {policy.vocab_size} tokens ({policy.tokenizer_file})",
        f"context         {policy.context_length} tokens",
        f"decoder         {policy.num_layers} layers, {policy.num_kv_heads} key/value heads of "
        f"{policy.head_dim}, {policy.dtype}, cache {policy.cache_layout.value}",
        "inputs          "
        + ", ".join(n for n in (t.input_ids, t.attention_mask, t.position_ids) if n)
        + f", {t.past_key}, {t.past_value} (i < {policy.num_layers})",
        f"outputs         {t.logits}, {t.present_key}, {t.present_value}",
        f"prompts         {policy.prompt_encoding.value} (completions "
        f"{policy.completion_encoding.value})",
        f"bos / pad       {policy.bos_token_id} / {policy.pad_token_id}",
        f"eos             {policy.eos_token_ids}",
        "special tokens  "
        + (", ".join(f"{k} {v!r}" for k, v in policy.special_tokens.items()) or "none"),
        "chat template   "
        + (f"{len(template)} characters: {template[:60]!r}" if template else "none"),
        f"generation      max_new_tokens {gen.max_new_tokens}, "
        + (
            f"sampling (temperature {gen.temperature:g}, top_p {gen.top_p:g}, top_k {gen.top_k})"
            if gen.do_sample
            else "greedy"
        ),
        f"golden prompts  {len(policy.golden)} (log-prob atol {policy.golden_atol:g})",
    ]
    return "\n".join(lines)
