"""One export: graph to ONNX, parity against the source, contract, verified atomic write.

Nothing is written unless parity passes; the written file is re-read and its golden vectors
re-run in its temporary place before it is moved into the model repository.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from export import writer
from export.actor_critic import observations, sequences
from export.actor_critic.contract_builder import GOLDEN_COUNT, build_contract, golden_vectors
from export.actor_critic.embedding import default_opset, with_contract
from export.actor_critic.parity import ParityReport, compare
from export.actor_critic.parity import report as parity_report
from export.actor_critic.source import Observations, PolicySource
from export.actor_critic.tensors import input_specs, parameter_width
from export.errors import ExportError
from export.onnx_export import to_onnx
from export.reweight import Reweighable
from export.runner import Runner, runner
from kernel import contract
from kernel.contract import GoldenVector
from kernel.spaces import leaves, sample

Progress = Callable[[str], None]
_EXAMPLE_BATCH = 2  # torch.export specialises batches of 0 and 1


@dataclass(frozen=True)
class ParitySettings:
    tolerance: float = 1e-5
    samples: int = 256
    observations_file: Path | None = None
    seed: int = 0


@dataclass(frozen=True)
class ExportOutcome:
    report: ParityReport
    path: Path | None  # None: parity failed and nothing was written
    # The graph an export of other weights of the same module may start from (``reuse``);
    # None when the exporter folded or transformed any of its tensors.
    reusable: Reweighable | None = None


def export_policy(
    source: PolicySource,
    parity: ParitySettings,
    destination: writer.Destination,
    progress: Progress,
    reuse: Reweighable | None = None,
) -> ExportOutcome:
    """Export ``source`` to ``destination`` behind the parity gate. ``reuse``: an earlier
    export's graph of this module (its ``reusable``), given the module's weights now instead
    of being traced again; should it fail the gate, the graph is traced and judged anew."""
    _check_settings(parity)
    checked = parity_observations(source, parity)
    if reuse is not None:
        progress("the earlier graph, with the module's weights now")
        model = reuse.with_weights(source.graph)
        report, golden = _parity(source, runner(model), checked, parity, progress)
        if report.passed:
            return _written(source, destination, model, (report, golden), reuse, progress)
        progress("the earlier graph with these weights failed parity: tracing the graph anew")
    progress("exporting the graph to ONNX (torch.onnx, dynamo, opset 18)")
    model = onnx_bytes(source, parity.seed)
    report, golden = _parity(source, runner(model), checked, parity, progress)
    if not report.passed:
        return ExportOutcome(report, None)
    reusable = Reweighable.of(model, source.graph)
    return _written(source, destination, model, (report, golden), reusable, progress)


def _parity(
    source: PolicySource,
    run: Runner,
    checked: Observations,
    parity: ParitySettings,
    progress: Progress,
) -> tuple[ParityReport, list[GoldenVector]]:
    if source.state is None:
        return _feed_forward_parity(source, run, checked, parity, progress)
    return _recurrent_parity(source, run, checked, parity, progress)


def _written(
    source: PolicySource,
    destination: writer.Destination,
    model: bytes,
    passed: tuple[ParityReport, list[GoldenVector]],
    reusable: Reweighable | None,
    progress: Progress,
) -> ExportOutcome:
    report, golden = passed
    policy = build_contract(source, destination.version, default_opset(model), golden)
    progress(f"writing {destination.version_dir / writer.MODEL_FILE}")
    path = writer.write(destination, with_contract(model, policy), check=verify_file)
    return ExportOutcome(report, path, reusable)


def _feed_forward_parity(
    source: PolicySource,
    run: Runner,
    checked: Observations,
    parity: ParitySettings,
    progress: Progress,
) -> tuple[ParityReport, list[GoldenVector]]:
    rows = observations.count(checked)
    masks = (
        observations.sampled_masks(source.action_space, rows, parity.seed)
        if source.action_masks
        else None
    )
    progress(
        f"checking parity on {rows} observations" + (" and masks" if masks is not None else "")
    )
    report = compare(source, run, checked, masks, parity.tolerance, parity.seed)
    return report, golden_vectors(source, run, checked, masks)


def _recurrent_parity(
    source: PolicySource,
    run: Runner,
    checked: Observations,
    parity: ParitySettings,
    progress: Progress,
) -> tuple[ParityReport, list[GoldenVector]]:
    lanes = min(sequences.LANES, observations.count(checked))
    progress(
        f"checking parity on {observations.count(checked)} observations, played as {lanes} "
        "sequences step by step"
    )
    played = sequences.replay(source, run, checked, parity.seed)
    report = parity_report(
        source, played.ours, played.theirs, played.sampled, parity.tolerance, played.sequences
    )
    return report, golden_vectors(source, run, played.observations, None, played.memory)


def _check_settings(parity: ParitySettings) -> None:
    if parity.samples < GOLDEN_COUNT:
        raise ExportError(
            f"--parity-samples {parity.samples}: needs at least {GOLDEN_COUNT} "
            "(the golden vectors are drawn from them)"
        )
    if not parity.tolerance >= 0:
        raise ExportError(f"--tolerance {parity.tolerance}: must be a number >= 0")


def onnx_bytes(source: PolicySource, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    example = [
        torch.from_numpy(sample(leaf, rng, _EXAMPLE_BATCH))
        for _, leaf in leaves(source.observation_space)
    ]
    if source.action_masks:
        example.append(
            torch.ones(_EXAMPLE_BATCH, parameter_width(source.action_space), dtype=torch.bool)
        )
    if source.state is not None:
        example.append(torch.zeros(_EXAMPLE_BATCH, source.state.size))
        example.append(torch.tensor([True, False]))
    inputs = input_specs(
        source.observation_space,
        source.action_space,
        action_masks=source.action_masks,
        state=source.state,
    )
    outputs = source.output_specs()
    return to_onnx(source.graph, example, [i.name for i in inputs], [o.name for o in outputs])


def parity_observations(source: PolicySource, parity: ParitySettings) -> Observations:
    drawn = observations.sampled(source.observation_space, parity.samples, parity.seed)
    if parity.observations_file is None:
        return drawn
    given = observations.from_file(source.observation_space, parity.observations_file)
    return observations.joined(drawn, given)


def verify_file(path: Path) -> None:
    """The written file reads back with its contract and reproduces its golden vectors."""
    problems = contract.check_golden(contract.read(path), runner(path))
    if problems:
        raise ExportError(f"{path}: the written model fails its own golden vectors: {problems[0]}")
