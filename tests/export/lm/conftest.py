"""The policies the exporter is tested on, and their exports, made once per test session.

The policies are ``tiny_policies``' genuine TRL runs (a Llama DPO run and a Qwen2 GRPO run
with full weights, a Llama GRPO run saved as a LoRA adapter over its base); ``tiny_models``
adds what those do not show.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

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
class LinkedExport:
    outcome: pipeline.LmExportOutcome
    checkpoint: Path
    template: str  # the chat template the directory held when it was loaded
    outside: Path  # the file its link was pointed at after loading


@pytest.fixture(scope="session")
def linked_export(
    lm_models: tiny_models.TinyModels,
    lm_repository: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> LinkedExport:
    """The tiny Llama from a directory whose ``chat_template.jinja`` is a link inside it (to
    ``templates/chat.jinja``), exported with small settings. Once it is loaded, the link is
    pointed at a file outside the directory: the version must hold what was read at load."""
    root = tmp_path_factory.mktemp("linked")
    checkpoint = Path(shutil.copytree(lm_models.llama, root / "llama-linked"))
    link = checkpoint / "chat_template.jinja"
    (checkpoint / "templates").mkdir()
    link.rename(checkpoint / "templates" / "chat.jinja")
    link.symlink_to(Path("templates") / "chat.jinja")
    loaded = source.load(source.LoadOptions(checkpoint=checkpoint))
    outside = root / "private.jinja"
    outside.write_text("PRIVATE {{ messages }}", encoding="utf-8")
    link.unlink()
    link.symlink_to(outside)
    destination = writer.destination(lm_repository, "llama-linked", None)
    settings = pipeline.LmParitySettings(prompts=4, new_tokens=8, golden=2)
    outcome = pipeline.export_language_model(loaded, settings, destination, lambda _: None)
    template = (checkpoint / "templates" / "chat.jinja").read_text(encoding="utf-8")
    return LinkedExport(outcome, checkpoint, template, outside)


def corrupted(model: Path, out: Path, *, vocab_size: int, scale: float) -> Path:
    """A copy of the graph whose output projection ([hidden, vocab], the untied head as the
    exporter stores it) is scaled: a subtly wrong export."""
    proto = onnx.load(str(model))
    (head,) = [
        t
        for t in proto.graph.initializer
        if len(t.dims) == 2 and t.dims[1] == vocab_size and t.dims[0] != vocab_size
    ]
    weights = numpy_helper.to_array(head) * scale
    head.CopyFrom(numpy_helper.from_array(weights.astype(np.float32), head.name))
    onnx.save(proto, str(out))
    return out


@dataclass(frozen=True)
class CliRun:
    done: subprocess.CompletedProcess[str]
    version_dir: Path


def rlserve(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m cli ...`` with one torch thread (tiny models; a busy machine)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "cli", *map(str, args)],
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
