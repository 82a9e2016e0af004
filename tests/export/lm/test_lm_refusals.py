"""What the language-model exporter refuses: parity failures (exit 1, nothing written),
architectures it cannot handle and adapters without their base (exit 2, by name)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import onnxruntime as ort
import pytest

from export.errors import ExportError
from export.lm import golden, parity, pipeline, source, vocabulary
from kernel.lm import greedy
from tests.export.lm.conftest import corrupted, rlserve
from tests.export.lm.tiny_models import TinyModels, orphan_adapter

if TYPE_CHECKING:
    from examples.lm.tiny_policy import TinyPolicies


def _run(path: Path) -> greedy.Runner:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds), strict=True))


def test_a_corrupted_graph_fails_parity_and_its_golden_prompts(
    llama_export: pipeline.LmExportOutcome, llama_source: source.CausalLM, tmp_path: Path
) -> None:
    assert llama_export.path is not None
    contract = llama_export.contract
    bad = corrupted(
        llama_export.path / "model.onnx",
        tmp_path / "bad.onnx",
        vocab_size=contract.vocab_size,
        scale=1.01,
    )
    prompts = golden.prompts(
        llama_source.tokenizer, contract.prompt_encoding, 4, 200, contract.eos_token_ids[0], 256
    )
    pad = contract.pad_token_id or 0
    references = [
        golden.reference(llama_source.model, p, contract.eos_token_ids, pad, 8) for p in prompts
    ]
    tokenizer_json = vocabulary.tokenizer_json(llama_source.tokenizer, "llama")
    good = parity.compare(
        contract,
        _run(llama_export.path / "model.onnx"),
        prompts,
        references,
        tokenizer_json,
        new_tokens=8,
        atol=1e-4,
    )
    assert good.passed, good.table()
    report = parity.compare(
        contract, _run(bad), prompts, references, tokenizer_json, new_tokens=8, atol=1e-4
    )
    assert not report.passed
    assert report.max_completion_diff > 1e-4
    table = report.table()
    assert "FAIL" in table
    assert table.endswith("parity FAILED")
    problems = greedy.check_golden(contract, _run(bad))
    assert len(problems) >= 1
    assert problems[0].startswith("golden prompt 0")


def test_parity_failure_exits_1_and_writes_nothing(lm_models: TinyModels, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    done = rlserve(
        "export",
        "lm",
        lm_models.llama,
        "--name",
        "strict",
        "--model-repository",
        repository,
        "--atol",
        "0",
        "--prompts",
        "3",
        "--new-tokens",
        "4",
        "--golden",
        "2",
    )
    assert done.returncode == 1, done.stderr
    assert "parity FAILED" in done.stdout
    assert "FAIL" in done.stdout
    assert "s] parity failed: nothing was written" in done.stderr
    assert "wrote" not in done.stdout
    assert not (repository / "strict").exists()


def test_an_unsupported_architecture_is_refused_by_name(
    lm_models: TinyModels, tmp_path: Path
) -> None:
    done = rlserve("export", "lm", lm_models.gpt2, "--name", "g", "--model-repository", tmp_path)
    assert done.returncode == 2
    assert "architecture GPT2LMHeadModel is not supported" in done.stderr
    assert "supported: LlamaForCausalLM, Qwen2ForCausalLM" in done.stderr
    assert not (tmp_path / "g").exists()


def test_an_adapter_whose_base_is_missing_is_refused(
    tiny_policies: TinyPolicies, tmp_path: Path
) -> None:
    orphan = orphan_adapter(tiny_policies.llama_grpo_lora, tmp_path / "orphan")
    with pytest.raises(
        ExportError, match=r"base model .*deleted-base.* give the base .* --base DIR"
    ):
        source.load(source.LoadOptions(checkpoint=orphan))
    with pytest.raises(ExportError, match=r"--base .*nowhere: no such directory"):
        source.load(source.LoadOptions(checkpoint=orphan, base=Path("/nowhere")))
    done = rlserve("export", "lm", orphan, "--name", "o", "--model-repository", tmp_path / "m")
    assert done.returncode == 2
    assert "give the base model's directory with --base DIR" in done.stderr
    merged = source.load(source.LoadOptions(checkpoint=orphan, base=tiny_policies.llama_base))
    assert merged.provenance.adapter is not None
    assert merged.provenance.adapter.base == "llama-base"


def test_base_is_refused_for_a_full_model(lm_models: TinyModels) -> None:
    with pytest.raises(ExportError, match=r"--base .* is a full model .* only for a PEFT adapter"):
        source.load(source.LoadOptions(checkpoint=lm_models.qwen2, base=lm_models.llama))


def test_a_directory_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"CHECKPOINT_DIR .*: no such directory"):
        source.load(source.LoadOptions(checkpoint=tmp_path / "missing"))
    with pytest.raises(ExportError, match=r"has no config.json"):
        source.load(source.LoadOptions(checkpoint=tmp_path))


def test_settings_that_leave_no_room_are_refused(
    llama_source: source.CausalLM, tmp_path: Path
) -> None:
    from export import writer

    destination = writer.destination(tmp_path, "m", None)
    for settings, message in [
        (pipeline.LmParitySettings(new_tokens=256), r"--new-tokens 256: leaves no room"),
        (pipeline.LmParitySettings(prompts=2, golden=3), r"--golden 3: must be from 1 to"),
        (pipeline.LmParitySettings(atol=-1.0), r"--atol -1.0: must be a number >= 0"),
    ]:
        with pytest.raises(ExportError, match=message):
            pipeline.export_language_model(llama_source, settings, destination, lambda _: None)
    assert not (tmp_path / "m").exists()
