"""``rlserve inspect`` and ``rlserve verify`` on an exported language model, run as commands;
verify with torch and transformers unimportable, as on a serving install."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from kernel.lm import contract as lm_contract
from tests.export.lm.conftest import LinkedExport, corrupted, rlserve

# `rlserve verify` in an interpreter where importing torch or transformers fails.
_WITHOUT_TORCH = (
    "import sys; sys.modules.update(torch=None, transformers=None, peft=None); "
    "from cli import main; raise SystemExit(main(sys.argv[1:]))"
)


def _verify_without_torch(model: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, "verify", str(model)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _version_copy(linked_export: LinkedExport, out: Path) -> Path:
    assert linked_export.outcome.path is not None
    return Path(shutil.copytree(linked_export.outcome.path, out))


def test_inspect_prints_the_language_model_contract(linked_export: LinkedExport) -> None:
    assert linked_export.outcome.path is not None
    model = linked_export.outcome.path / "model.onnx"
    contract = linked_export.outcome.contract
    done = rlserve("inspect", model)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "algorithm       none (causal-lm)" in lines
    assert f"checkpoint      llama-linked sha256:{contract.source.sha256}" in lines
    version = contract.source.framework_version
    assert f"source          transformers {version}, LlamaForCausalLM" in lines
    assert f"vocabulary      {contract.vocab_size} tokens (tokenizer.json)" in lines
    assert f"eos             {contract.eos_token_ids}" in lines
    assert "generation      max_new_tokens 64, sampling (temperature 0.7, top_p 0.9, top_k 0)" in (
        lines
    )
    assert f"golden prompts  {len(contract.golden)} (log-prob atol 0.0001)" in lines
    as_json = rlserve("inspect", "--json", model)
    assert as_json.returncode == 0, as_json.stderr
    assert lm_contract.parse(as_json.stdout, "inspect --json") == contract


def test_verify_reproduces_the_golden_prompts_without_torch(linked_export: LinkedExport) -> None:
    assert linked_export.outcome.path is not None
    model = linked_export.outcome.path / "model.onnx"
    done = _verify_without_torch(model)
    assert done.returncode == 0, done.stderr
    golden = len(linked_export.outcome.contract.golden)
    assert done.stdout.strip() == f"{model}: OK, {golden} golden prompts reproduced"


def test_verify_fails_a_changed_model_or_a_missing_tokenizer(
    linked_export: LinkedExport, tmp_path: Path
) -> None:
    contract = linked_export.outcome.contract
    changed = _version_copy(linked_export, tmp_path / "changed")
    corrupted(
        changed / "model.onnx",
        changed / "model.onnx",
        vocab_size=contract.vocab_size,
        scale=1.01,
    )
    done = rlserve("verify", changed / "model.onnx")
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("FAIL golden prompt 0 (")
    assert done.stdout.strip().endswith("the file is not intact")
    bare = _version_copy(linked_export, tmp_path / "bare")
    (bare / "tokenizer.json").unlink()
    done = _verify_without_torch(bare / "model.onnx")
    assert done.returncode == 1, done.stderr
    assert "FAIL " in done.stdout
    assert "cannot read the tokenizer tokenizer.json beside model.onnx" in done.stdout
