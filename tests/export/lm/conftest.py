"""The policies the exporter is tested on, and their exports, made once per test session.

The policies are ``tiny_policies``' genuine TRL runs (a Llama DPO run and a Qwen2 GRPO run
with full weights, a Llama GRPO run saved as a LoRA adapter over its base); ``tiny_models``
adds what those do not show.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from export import writer
from export.lm import pipeline, source
from export.lm.graph_kind import GraphKind
from tests.export.lm import tiny_models

if TYPE_CHECKING:
    from examples.lm.tiny_policy import TinyPolicies


@pytest.fixture(scope="session")
def lm_models(tmp_path_factory: pytest.TempPathFactory) -> tiny_models.TinyModels:
    with source.quiet_transformers():
        return tiny_models.make(tmp_path_factory.mktemp("lm-models"))


@pytest.fixture(scope="session")
def lm_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lm-repository")


@pytest.fixture(scope="session")
def llama_source(tiny_policies: TinyPolicies) -> source.CausalLM:
    return source.load(source.LoadOptions(checkpoint=tiny_policies.llama_dpo))


@pytest.fixture(scope="session")
def llama_export(llama_source: source.CausalLM, lm_repository: Path) -> pipeline.LmExportOutcome:
    destination = writer.destination(lm_repository, "llama-dpo", None)
    return pipeline.export_language_model(
        llama_source, pipeline.LmParitySettings(), destination, progress=lambda _: None
    )


@pytest.fixture(scope="session")
def lora_export(tiny_policies: TinyPolicies, lm_repository: Path) -> pipeline.LmExportOutcome:
    """The adapter's recorded base is a local directory: no --base needed."""
    loaded = source.load(source.LoadOptions(checkpoint=tiny_policies.llama_grpo_lora))
    destination = writer.destination(lm_repository, "llama-grpo-lora", None)
    return pipeline.export_language_model(
        loaded, pipeline.LmParitySettings(prompts=8), destination, progress=lambda _: None
    )


@pytest.fixture(scope="session")
def qwen2_grpo_export(
    tiny_policies: TinyPolicies, lm_repository: Path
) -> tuple[source.CausalLM, pipeline.LmExportOutcome]:
    """Exported with the torch.onnx graph (the others: GroupQueryAttention), so both graphs'
    exports are tested."""
    loaded = source.load(source.LoadOptions(checkpoint=tiny_policies.qwen2_grpo))
    destination = writer.destination(lm_repository, "qwen2-grpo", None)
    outcome = pipeline.export_language_model(
        loaded,
        pipeline.LmParitySettings(prompts=8),
        destination,
        progress=lambda _: None,
        kind=GraphKind.TORCH,
    )
    return loaded, outcome


@dataclass(frozen=True)
class CliRun:
    done: subprocess.CompletedProcess[str]
    version_dir: Path


def rlserve(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m serve.cli ...`` with one torch thread (tiny models; a busy machine)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "serve.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


@pytest.fixture(scope="session")
def qwen2_cli_export(lm_models: tiny_models.TinyModels, lm_repository: Path) -> CliRun:
    done = rlserve(
        "export", "lm", lm_models.qwen2, "--name", "qwen2", "--model-repository", lm_repository
    )
    return CliRun(done, lm_repository / "qwen2" / "1")
