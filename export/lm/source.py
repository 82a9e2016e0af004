"""Loading the source model: a causal-LM directory in float32, a PEFT adapter merged into its
base in full precision, the tokenizer, and where they came from.

Nothing is downloaded (``local_files_only``). Attention is transformers' eager
implementation: the graph exported from it takes an explicit additive mask, which is what
left-padded batches need.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.errors import ExportError
from export.lm import checkpoint, generation, training
from export.lm.checkpoint import Checkpoint, SideFile
from kernel.contract import Algorithm
from kernel.errors import one_line
from kernel.lm.contract import Adapter, LanguageModelSource

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class LoadOptions:
    checkpoint: Path
    base: Path | None = None
    algorithm: Algorithm | None = None  # forced; None: read from the directory


@dataclass(frozen=True)
class CausalLM:
    """A loaded source: the model in eval mode, its tokenizer and its provenance."""

    checkpoint: Checkpoint
    model: Any  # a transformers PreTrainedModel (LlamaForCausalLM, ...), float32, eval
    tokenizer: Any  # a fast transformers tokenizer
    generation: dict[str, Any]  # generation_config.json as it was ({} without one)
    side_files: dict[str, SideFile]  # copied beside model.onnx, as read at load
    algorithm: Algorithm | None
    algorithm_evidence: str  # why this algorithm, for the progress line
    provenance: LanguageModelSource

    @property
    def config(self) -> Any:
        return self.model.config


def load(options: LoadOptions) -> CausalLM:
    found = checkpoint.inspect(options.checkpoint, options.base)
    trained = training.detect(found.path)
    algorithm, evidence = _algorithm(options.algorithm, trained)
    with quiet_transformers():
        model = _model(found)
        tokenizer = _tokenizer(found)
    _check_vocabulary(model, tokenizer, found)
    side_files = found.side_files()
    return CausalLM(
        checkpoint=found,
        model=model,
        tokenizer=tokenizer,
        generation=generation.read(side_files.get(generation.FILE)),
        side_files=side_files,
        algorithm=algorithm,
        algorithm_evidence=evidence,
        provenance=_provenance(found, trained),
    )


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars, info logs or warnings from transformers and peft."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _algorithm(
    forced: Algorithm | None, trained: training.Training
) -> tuple[Algorithm | None, str]:
    if forced is not None:
        if trained.algorithm is not None and trained.algorithm is not forced:
            return (
                forced,
                f"--algorithm; the directory says {trained.algorithm.value}: {trained.evidence}",
            )
        return forced, "--algorithm"
    if trained.algorithm is not None:
        return trained.algorithm, trained.evidence or "the directory"
    return None, "nothing in the directory says; a plain causal LM unless --algorithm dpo|grpo"


def _model(found: Checkpoint) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(found.model.path),
            dtype=torch.float32,
            attn_implementation="eager",
            local_files_only=True,
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise ExportError(
            f"{found.model.path}: transformers could not load the model ({one_line(exc)})"
        ) from None
    if found.adapter is not None:
        model = _merged(model, found)
    return model.eval()


def _merged(base: Any, found: Checkpoint) -> Any:
    """The adapter merged into the float32 base: W + scale * B @ A, then plain modules again."""
    from peft import PeftModel

    assert found.adapter is not None
    try:
        adapted = PeftModel.from_pretrained(base, str(found.adapter.path), is_trainable=False)
        return adapted.merge_and_unload(safe_merge=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise ExportError(
            f"{found.adapter.path}: the adapter could not be merged into {found.model.path} "
            f"({one_line(exc)}); is --base the model it was trained on?"
        ) from None


def _tokenizer(found: Checkpoint) -> Any:
    from transformers import AutoTokenizer

    own = any((found.path / name).is_file() for name in _TOKENIZER_FILES)
    directory = found.path if own else found.model.path
    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ExportError(
            f"{directory}: transformers could not load the tokenizer ({one_line(exc)}); the "
            "directory needs tokenizer.json and tokenizer_config.json"
        ) from None


def _check_vocabulary(model: Any, tokenizer: Any, found: Checkpoint) -> None:
    """Every id the tokenizer can produce must have a row in the model's embeddings."""
    logits = int(model.get_output_embeddings().weight.shape[0])
    if len(tokenizer) <= logits:
        return
    beyond = tokenizer.convert_ids_to_tokens(list(range(logits, len(tokenizer))))
    raise ExportError(
        f"{found.path}: the tokenizer has {len(tokenizer)} tokens but the model only "
        f"{logits} (vocab_size); tokens {beyond[:5]} (ids {logits}..{len(tokenizer) - 1}) have "
        "no embedding, so a prompt holding them would fail; resize the model's embeddings "
        "(model.resize_token_embeddings(len(tokenizer))) or drop those tokens, and save again"
    )


def _provenance(found: Checkpoint, trained: training.Training) -> LanguageModelSource:
    import transformers

    adapter = None
    if found.adapter is not None:
        adapter = Adapter(
            kind=found.adapter.kind,
            path=found.adapter.path.name,
            sha256=found.adapter.sha256(),
            base=found.model.path.name,
            base_sha256=found.model.sha256(),
        )
    return LanguageModelSource(
        framework_version=transformers.__version__,
        architecture=found.model.architecture,
        checkpoint=found.path.name,
        sha256=found.adapter.sha256() if found.adapter is not None else found.model.sha256(),
        adapter=adapter,
        trainer=trained.trainer,
    )
