"""Exports of tiny Llama and Qwen2 models (the TRL runs of both architectures among them) and of
a merged LoRA adapter: the version directory, the graph as written, the contract, and the
written model decoding its golden prompts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
import pytest

from export.lm import contract_builder, golden, pipeline, source
from export.lm.golden import PromptKind
from kernel.lm import greedy
from kernel.lm.contract import CacheLayout, DecoderTensors, LanguageModelContract, PromptEncoding
from tests.export.lm.conftest import CliRun
from tests.export.lm.tiny_models import TinyModels

if TYPE_CHECKING:
    from examples.lm.tiny_policy import TinyPolicies

VERSION_FILES = {
    "model.onnx",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
}


def _run(path: Path) -> greedy.Runner:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    return run


def _token(model_dir: Path, text: str) -> int:
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    return int({**tokenizer["model"]["vocab"], **added}[text])


def _config(model_dir: Path) -> dict[str, Any]:
    return dict(json.loads((model_dir / "config.json").read_text()))


def test_llama_export_writes_one_whole_version(
    llama_export: pipeline.LmExportOutcome, tiny_policies: TinyPolicies
) -> None:
    assert llama_export.report.passed, llama_export.report.table()
    assert llama_export.path is not None
    assert {p.name for p in llama_export.path.iterdir()} == VERSION_FILES
    assert llama_export.path.parent.name == "llama-dpo"
    assert llama_export.path.name == "1"
    for name in ("chat_template.jinja", "generation_config.json", "tokenizer_config.json"):
        assert (llama_export.path / name).read_bytes() == (
            tiny_policies.llama_dpo / name
        ).read_bytes()


def test_the_graph_has_exactly_the_contract_tensors(
    llama_export: pipeline.LmExportOutcome, tiny_policies: TinyPolicies
) -> None:
    assert llama_export.path is not None
    config = _config(tiny_policies.llama_dpo)
    layers, kv_heads = int(config["num_hidden_layers"]), int(config["num_key_value_heads"])
    head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
    session = ort.InferenceSession(
        str(llama_export.path / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    inputs = {i.name: (i.type, i.shape) for i in session.get_inputs()}
    outputs = {o.name: (o.type, o.shape) for o in session.get_outputs()}
    past = ("tensor(float)", ["batch", kv_heads, "past", head_dim])
    present = ("tensor(float)", ["batch", kv_heads, "total", head_dim])
    kinds = ("key", "value")
    assert inputs == {  # the GroupQueryAttention graph: positions come from the mask
        "input_ids": ("tensor(int64)", ["batch", "sequence"]),
        "attention_mask": ("tensor(int64)", ["batch", "total"]),
        **{f"past_key_values.{i}.{kv}": past for i in range(layers) for kv in kinds},
    }
    assert outputs == {
        "logits": ("tensor(float)", ["batch", "sequence", config["vocab_size"]]),
        **{f"present.{i}.{kv}": present for i in range(layers) for kv in kinds},
    }
    contract = llama_export.contract
    assert contract.cache_layout is CacheLayout.SEQUENCE_LENGTHS
    assert contract.tensors.position_ids is None
    assert (contract.num_layers, contract.num_kv_heads, contract.head_dim) == (
        layers,
        kv_heads,
        head_dim,
    )


def test_the_contract_records_the_policy(
    llama_export: pipeline.LmExportOutcome, tiny_policies: TinyPolicies
) -> None:
    assert llama_export.path is not None
    directory = tiny_policies.llama_dpo
    contract = pipeline.read_contract(llama_export.path / "model.onnx")
    assert contract == llama_export.contract
    assert contract.algorithm is not None
    assert contract.algorithm.value == "dpo"
    config = _config(directory)
    assert (contract.vocab_size, contract.context_length) == (
        config["vocab_size"],
        config["max_position_embeddings"],
    )
    assert contract.eos_token_ids == [_token(directory, "</s>")]
    assert contract.bos_token_id == _token(directory, "<s>")
    assert contract.pad_token_id == _token(directory, "<pad>")
    assert contract.prompt_encoding is PromptEncoding.WITH_SPECIAL_TOKENS  # adds BOS
    assert contract.special_tokens["eos_token"] == "</s>"
    assert contract.chat_template == (directory / "chat_template.jinja").read_text()
    generation = json.loads((directory / "generation_config.json").read_text())
    assert contract.generation_defaults.max_new_tokens == generation["max_new_tokens"]
    weights = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    assert contract.source.sha256 == weights
    assert contract.source.checkpoint == directory.name
    assert contract.source.architecture == "LlamaForCausalLM"
    assert contract.source.adapter is None
    assert contract.source.trainer is not None
    assert contract.source.trainer.startswith("trl 1.")
    assert contract.golden_atol == 1e-4
    assert contract.policy_version == 1


def test_eos_drift_is_resolved_into_the_union(lm_models: TinyModels) -> None:
    """config.json says </s>, generation_config.json <|im_end|>, the tokenizer <|eot|>."""
    loaded = source.load(source.LoadOptions(checkpoint=lm_models.llama))
    contract = contract_builder.draft(
        loaded,
        version=1,
        opset=18,
        atol=1e-4,
        tensors=DecoderTensors(),
        cache_layout=CacheLayout.LEFT_PADDED,
    )
    names = ("</s>", "<|im_end|>", "<|eot|>")
    assert contract.eos_token_ids == sorted(_token(lm_models.llama, n) for n in names)
    assert contract.special_tokens["eos_token"] == "<|eot|>"
    defaults = contract.generation_defaults
    assert (defaults.temperature, defaults.top_p, defaults.do_sample) == (0.7, 0.9, True)
    assert defaults.max_new_tokens == 64  # the file does not say: the contract's default
    assert contract.algorithm is None  # no trace of a trainer


def test_golden_prompts_mix_text_and_chat_and_are_reproduced_by_the_written_model(
    llama_export: pipeline.LmExportOutcome, llama_source: source.CausalLM
) -> None:
    assert llama_export.path is not None
    contract = pipeline.read_contract(llama_export.path / "model.onnx")
    assert len(contract.golden) == 4
    room = contract.context_length - 32
    made = golden.prompts(
        llama_source.tokenizer,
        contract.prompt_encoding,
        16,
        room,
        contract.eos_token_ids[0],
        contract.context_length,
    )
    kinds = {p.kind for p in made for g in contract.golden if g.prompt_ids == p.ids}
    assert kinds == {PromptKind.TEXT, PromptKind.CHAT}
    assert len({len(g.prompt_ids) for g in contract.golden}) == 4
    assert all(len(g.greedy_ids) == len(g.log_probs) for g in contract.golden)
    assert greedy.check_golden(contract, _run(llama_export.path / "model.onnx")) == []


def test_prompts_and_completions_are_cut_to_fit_the_context(
    llama_source: source.CausalLM,
) -> None:
    tokenizer = llama_source.tokenizer
    made = golden.prompts(tokenizer, PromptEncoding.WITH_SPECIAL_TOKENS, 12, 6, 1, 9)
    assert {p.kind for p in made} == {PromptKind.TEXT, PromptKind.CHAT}
    assert all(1 <= len(p.ids) <= 6 for p in made)
    assert all(len(p.ids) + len(p.completion_ids) <= 9 for p in made)
    assert max(len(p.ids) for p in made) == 6  # long ones were cut, not dropped
    full = golden.prompts(tokenizer, PromptEncoding.WITH_SPECIAL_TOKENS, 12, 200, 1, 256)
    assert [p.ids[:6] for p in full] == [p.ids for p in made]
    assert len({len(p.ids) for p in full}) >= 8  # uneven lengths


def test_parity_covered_every_prompt_and_a_padded_batch(
    llama_export: pipeline.LmExportOutcome,
) -> None:
    report = llama_export.report
    assert len(report.prompts) == 16
    assert {row.kind.value for row in report.prompts} == {"text", "chat"}
    assert all(row.first_mismatch is None and row.tokenizer_same for row in report.prompts)
    assert report.max_greedy_diff <= 1e-4
    assert report.max_completion_diff <= 1e-4
    assert report.batch is not None
    assert report.batch.passed
    assert report.batch.layout is CacheLayout.SEQUENCE_LENGTHS  # right-padded rows
    assert len(set(report.batch.lengths)) == len(report.batch.lengths) == 3


@pytest.mark.slow  # a second whole export; the CLI path runs in CI in test_lm_refusals.py
def test_qwen2_exports_through_the_cli(qwen2_cli_export: CliRun) -> None:
    done = qwen2_cli_export.done
    assert done.returncode == 0, done.stderr
    model = qwen2_cli_export.version_dir / "model.onnx"
    assert "parity PASSED" in done.stdout
    assert done.stdout.strip().endswith(f"wrote {qwen2_cli_export.version_dir}")
    assert "] loaded Qwen2ForCausalLM" in done.stderr
    assert "algorithm grpo (training_args.bin holds a GRPOConfig)" in done.stderr
    assert "Loading weights" not in done.stderr  # no progress bars from transformers
    contract = pipeline.read_contract(model)
    assert contract.prompt_encoding is PromptEncoding.PLAIN  # Qwen2 adds no BOS
    assert contract.bos_token_id is None
    assert contract.source.architecture == "Qwen2ForCausalLM"
    assert greedy.check_golden(contract, _run(model)) == []


def test_a_qwen2_grpo_run_exports_with_its_full_weights(
    qwen2_grpo_export: tuple[source.CausalLM, pipeline.LmExportOutcome],
    tiny_policies: TinyPolicies,
) -> None:
    """TRL's GRPOTrainer on the Qwen2 base, saved whole: the other architecture's TRL output."""
    loaded, outcome = qwen2_grpo_export
    directory = tiny_policies.qwen2_grpo
    assert outcome.path is not None, outcome.report.table()
    assert {p.name for p in outcome.path.iterdir()} == VERSION_FILES
    assert "grpo" in loaded.algorithm_evidence.lower()
    contract = pipeline.read_contract(outcome.path / "model.onnx")
    assert contract == outcome.contract
    assert contract.algorithm is not None
    assert contract.algorithm.value == "grpo"
    assert contract.source.architecture == "Qwen2ForCausalLM"
    assert contract.source.adapter is None
    assert contract.source.trainer is not None
    assert contract.source.trainer.startswith("trl 1.")
    weights = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    assert contract.source.sha256 == weights
    # Every token the tokenizer knows, <|endoftext|> included, has a row of logits.
    assert contract.vocab_size == _config(directory)["vocab_size"] == len(loaded.tokenizer)
    assert _token(directory, "<|endoftext|>") < contract.vocab_size
    assert contract.prompt_encoding is PromptEncoding.PLAIN  # Qwen2 adds no BOS
    assert contract.eos_token_ids == [_token(directory, "</s>")]
    assert all(row.first_mismatch is None for row in outcome.report.prompts)
    assert greedy.check_golden(contract, _run(outcome.path / "model.onnx")) == []
    # The torch.onnx graph: positions as an input, rows left-padded, and so checked.
    assert contract.cache_layout is CacheLayout.LEFT_PADDED
    assert contract.tensors.position_ids == "position_ids"
    session = ort.InferenceSession(str(outcome.path / "model.onnx"))
    assert "position_ids" in {i.name for i in session.get_inputs()}
    assert outcome.report.batch is not None
    assert outcome.report.batch.layout is CacheLayout.LEFT_PADDED
    assert outcome.report.batch.passed


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_a_lora_adapter_is_merged_into_its_base(
    lora_export: pipeline.LmExportOutcome, tiny_policies: TinyPolicies
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert lora_export.path is not None, lora_export.report.table()
    contract = pipeline.read_contract(lora_export.path / "model.onnx")
    adapter = contract.source.adapter
    assert adapter is not None
    assert adapter.kind == "lora"
    assert (adapter.path, adapter.base) == ("llama-grpo-lora", "llama-base")
    adapter_weights = (tiny_policies.llama_grpo_lora / "adapter_model.safetensors").read_bytes()
    assert adapter.sha256 == contract.source.sha256 == hashlib.sha256(adapter_weights).hexdigest()
    base_weights = (tiny_policies.llama_base / "model.safetensors").read_bytes()
    assert adapter.base_sha256 == hashlib.sha256(base_weights).hexdigest()
    assert contract.algorithm is not None
    assert contract.algorithm.value == "grpo"
    # The merged graph scores like the adapter applied, unmerged, on its base in transformers,
    # and unlike the base alone.
    base = AutoModelForCausalLM.from_pretrained(
        str(tiny_policies.llama_base), attn_implementation="eager"
    ).eval()
    record = max(contract.golden, key=lambda g: len(g.greedy_ids))
    tokens = torch.tensor([record.prompt_ids + record.greedy_ids])
    start = len(record.prompt_ids) - 1

    def transformers_scores(model: object) -> np.ndarray:
        with torch.no_grad():
            logits = model(input_ids=tokens).logits[0].double().log_softmax(-1)  # type: ignore[operator]
        return np.asarray([float(logits[start + k, t]) for k, t in enumerate(record.greedy_ids)])

    alone = transformers_scores(base)  # before PeftModel wraps (and changes) the base
    adapted = transformers_scores(
        PeftModel.from_pretrained(base, str(tiny_policies.llama_grpo_lora)).eval()
    )
    run = _run(lora_export.path / "model.onnx")
    scored = np.asarray(greedy.score(run, contract, record.prompt_ids, record.greedy_ids))
    assert np.max(np.abs(scored - adapted)) < 1e-4
    assert np.max(np.abs(scored - alone)) > 1e-3


def test_the_contract_parses_as_written(llama_export: pipeline.LmExportOutcome) -> None:
    text = llama_export.contract.to_json()
    assert LanguageModelContract.model_validate_json(text) == llama_export.contract
    assert json.loads(text)["kind"] == "causal-lm"


def test_a_reused_graph_given_new_weights_is_what_the_builder_builds_for_them(
    llama_export: pipeline.LmExportOutcome, llama_source: source.CausalLM, lm_repository: Path
) -> None:
    """A trainer's next version: the first export's graph with the new weights holds, byte
    for byte, the weights the builder would write, and passes the parity gate."""
    import copy
    import dataclasses

    import torch

    from export import writer
    from export.lm import gqa

    assert llama_export.reusable is not None  # its weights follow the builder's layout
    changed = copy.deepcopy(llama_source.model)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    reused = llama_export.reusable.with_weights(changed)
    built = gqa.export(changed, llama_source.tokenizer)
    assert reused.mismatched_weights(changed) == built.mismatched_weights(changed) == []
    raw = {t.name: t.raw_data for t in built._model.graph.initializer}
    assert {t.name: t.raw_data for t in reused._model.graph.initializer} == raw
    moved = dataclasses.replace(llama_source, model=changed)
    outcome = pipeline.export_language_model(
        moved, pipeline.LmParitySettings(prompts=4), writer.destination(lm_repository, "reused", 1),
        progress=lambda _: None, reuse=llama_export.reusable,
    )  # fmt: skip
    assert outcome.report.passed, outcome.report.table()
    assert outcome.timings.export_s < 0.5  # no build
    assert outcome.reusable is not None
