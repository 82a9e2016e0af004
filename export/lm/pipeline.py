"""One language-model export: draft contract, ONNX decoder, parity, verified atomic version.

Nothing is written unless parity passes. The version directory (``model.onnx`` with the
contract in its metadata, ``tokenizer.json``, and the source's tokenizer config, generation
config and chat template as they were) is assembled in a staging directory, re-read there
(its contract parses, its tokenizer loads, its golden prompts decode as recorded) and only
then renamed into the model repository.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from export import writer
from export.errors import ExportError
from export.lm import contract_builder, golden, gqa, graph, parity, vocabulary
from export.lm.graph_kind import GraphKind
from export.lm.source import CausalLM, quiet_transformers
from export.runner import runner
from kernel.contract import METADATA_KEY
from kernel.errors import ContractError
from kernel.lm import greedy
from kernel.lm.contract import (
    TOKENIZER_FILE,
    CacheLayout,
    DecoderTensors,
    LanguageModelContract,
    parse,
)

Progress = Callable[[str], None]
Graph = graph.DecoderGraph | gqa.BuiltGraph


@dataclass(frozen=True)
class LmParitySettings:
    prompts: int = 16
    new_tokens: int = 32
    atol: float = 1e-4
    golden: int = 4  # golden prompts kept in the contract (the server re-runs them at load)


@dataclass(frozen=True)
class Timings:
    export_s: float  # torch.onnx.export of the decoder
    reference_s: float  # transformers: generate and score
    parity_s: float  # onnxruntime: greedy, score, batch check
    write_s: float  # save, verify, rename (0 when nothing was written)


@dataclass(frozen=True)
class LmExportOutcome:
    report: parity.ParityReport
    path: Path | None  # the version directory; None: parity failed and nothing was written
    contract: LanguageModelContract
    timings: Timings
    # The graph an export of other weights of the same model may start from (``reuse``):
    # a builder's graph whose every weight is the model's by the builder's layout; else None.
    reusable: gqa.BuiltGraph | None = None


def export_language_model(
    source: CausalLM,
    settings: LmParitySettings,
    destination: writer.Destination,
    progress: Progress,
    kind: GraphKind = GraphKind.GQA,
    reuse: gqa.BuiltGraph | None = None,
) -> LmExportOutcome:
    """Export ``source`` to ``destination`` behind the parity gate. ``reuse``: a graph an
    earlier export of this model made (its ``reusable``), given this model's weights
    instead of being built again (a trainer's next version: milliseconds, not seconds)."""
    if kind is GraphKind.GQA:
        tensors, layout = gqa.TENSORS, CacheLayout.SEQUENCE_LENGTHS
    else:
        tensors, layout = DecoderTensors(), CacheLayout.LEFT_PADDED
    draft = contract_builder.draft(
        source,
        version=destination.version,
        opset=graph.OPSET,
        atol=settings.atol,
        tensors=tensors,
        cache_layout=layout,
    )
    room = _check_settings(settings, draft.context_length)
    tokenizer_json = vocabulary.tokenizer_json(source.tokenizer, str(source.checkpoint.path))
    clock = [time.perf_counter()]
    decoder: Graph
    reusable = None
    if kind is GraphKind.GQA and reuse is not None:
        progress("the earlier graph, with this model's weights")
        decoder = reusable = reuse.with_weights(source.model)
        draft = draft.model_copy(update={"opset": decoder.opset})
    elif kind is GraphKind.GQA:
        progress("building the decoder with onnxruntime-genai (GroupQueryAttention, fp32)")
        decoder = gqa.export(source.model, source.tokenizer)
        draft = draft.model_copy(update={"opset": decoder.opset})
        reusable = None if decoder.mismatched_weights(source.model) else decoder
    else:
        progress(f"exporting the decoder to ONNX (torch.onnx, dynamo, opset {graph.OPSET})")
        decoder = graph.export(source.model, draft.tensors)
    clock.append(time.perf_counter())
    progress(f"exported in {clock[-1] - clock[-2]:.1f} s")
    prompts, references = _references(source, draft, settings, room, progress)
    clock.append(time.perf_counter())
    progress("onnxruntime: checking parity (greedy tokens, log-probs, tokenizer, padded batch)")
    report = _parity(decoder, draft, prompts, references, tokenizer_json, settings)
    clock.append(time.perf_counter())
    if not report.passed:
        return LmExportOutcome(report, None, draft, _timings(clock), reusable)
    final = contract_builder.with_golden(draft, prompts, references, settings.golden)
    decoder.set_metadata(METADATA_KEY, final.to_json())
    progress(f"writing {destination.version_dir}")
    path = writer.write_version(
        destination, _filler(decoder, tokenizer_json, source), check=verify_version
    )
    clock.append(time.perf_counter())
    return LmExportOutcome(report, path, final, _timings(clock), reusable)


def _references(
    source: CausalLM,
    draft: LanguageModelContract,
    settings: LmParitySettings,
    room: int,
    progress: Progress,
) -> tuple[list[golden.Prompt], list[golden.Reference]]:
    """The parity prompts and what transformers makes of them."""
    eos = draft.eos_token_ids
    pad = draft.pad_token_id if draft.pad_token_id is not None else eos[0]
    with quiet_transformers():
        prompts = golden.prompts(
            source.tokenizer,
            draft.prompt_encoding,
            settings.prompts,
            room,
            eos[0],
            draft.context_length,
        )
        progress(
            f"transformers: greedy generation of up to {settings.new_tokens} tokens and "
            f"scoring on {len(prompts)} prompts"
        )
        references = [
            golden.reference(source.model, p, eos, pad, settings.new_tokens) for p in prompts
        ]
    return prompts, references


def _parity(
    decoder: Graph,
    draft: LanguageModelContract,
    prompts: list[golden.Prompt],
    references: list[golden.Reference],
    tokenizer_json: str,
    settings: LmParitySettings,
) -> parity.ParityReport:
    """The candidate graph, saved to a scratch directory, against the references."""
    with tempfile.TemporaryDirectory(prefix="rlserve-lm-") as scratch:
        candidate = Path(scratch) / writer.MODEL_FILE
        decoder.save(candidate)
        return parity.compare(
            draft,
            runner(candidate),
            prompts,
            references,
            tokenizer_json,
            new_tokens=settings.new_tokens,
            atol=settings.atol,
        )


def _filler(decoder: Graph, tokenizer_json: str, source: CausalLM) -> Callable[[Path], None]:
    """What goes into the version directory."""

    def fill(staging: Path) -> None:
        decoder.save(staging / writer.MODEL_FILE)
        (staging / TOKENIZER_FILE).write_text(tokenizer_json, encoding="utf-8")
        for name, side in source.side_files.items():  # the bytes read at load, not re-read
            (staging / name).write_bytes(side.data)

    return fill


def _timings(clock: list[float]) -> Timings:
    steps = [b - a for a, b in itertools.pairwise(clock)]
    steps += [0.0] * (4 - len(steps))
    return Timings(export_s=steps[0], reference_s=steps[1], parity_s=steps[2], write_s=steps[3])


def _check_settings(settings: LmParitySettings, context_length: int) -> int:
    """The room a prompt has in the context; ExportError names the setting that is wrong."""
    if settings.prompts < 1:
        raise ExportError(f"--prompts {settings.prompts}: needs at least 1")
    if settings.new_tokens < 1:
        raise ExportError(f"--new-tokens {settings.new_tokens}: needs at least 1")
    if not settings.atol >= 0:
        raise ExportError(f"--atol {settings.atol}: must be a number >= 0")
    if not 1 <= settings.golden <= settings.prompts:
        raise ExportError(
            f"--golden {settings.golden}: must be from 1 to --prompts ({settings.prompts}); the "
            "golden prompts are taken from the parity prompts"
        )
    room = context_length - settings.new_tokens
    if room < 1:
        raise ExportError(
            f"--new-tokens {settings.new_tokens}: leaves no room for a prompt in the model's "
            f"context of {context_length} tokens; give fewer than {context_length}"
        )
    return room


def read_contract(path: Path) -> LanguageModelContract:
    """The causal-lm contract of a model.onnx, read through onnxruntime."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if text is None:
        raise ContractError(f"{path}: the ONNX file has no policy contract ({METADATA_KEY!r})")
    return parse(text, str(path))


def verify_version(directory: Path) -> None:
    """The staged version reads back whole and reproduces its golden prompts."""
    from tokenizers import Tokenizer

    model = directory / writer.MODEL_FILE
    written = read_contract(model)
    try:
        Tokenizer.from_file(str(directory / written.tokenizer_file))
    except Exception as exc:  # tokenizers raises plain Exception for unreadable files
        raise ExportError(f"{directory / written.tokenizer_file}: does not load ({exc})") from None
    problems = greedy.check_golden(written, runner(model))
    if problems:
        raise ExportError(f"{model}: the written model fails its own golden prompts: {problems[0]}")
