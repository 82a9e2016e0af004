"""Parity: the source framework and onnxruntime must agree before anything is written.

Every output is compared on the same raw observations: discrete actions must match exactly;
float values must satisfy ``|onnx - source| <= tolerance * (1 + |source|)`` element-wise,
an absolute tolerance near zero that grows with the value's magnitude (float32 carries about
7 significant digits, so a value of 100 cannot be pinned to 1e-5 absolutely).

The ``log_prob`` row (for a policy with a distribution) holds :mod:`kernel.distributions`,
run on onnxruntime's distribution parameters, to the source's own log-probabilities of
actions sampled from the source's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from export.actor_critic.source import Observations, PolicySource, SampledLogProb
from export.actor_critic.tensors import graph_feeds
from export.runner import Runner
from kernel.contract import TensorRole, TensorSpec
from kernel.distributions import build

LOG_PROB = "log_prob"


@dataclass(frozen=True)
class ParityRow:
    output: str
    max_abs_diff: float
    largest: float  # largest magnitude among the source's values
    exact_match: float | None  # share of rows with identical discrete actions
    passed: bool


@dataclass(frozen=True)
class ParityReport:
    rows: list[ParityRow]
    samples: int
    tolerance: float
    sequences: int = 0  # a recurrent policy's: episodes played step by step

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    def table(self) -> str:
        header = (
            f"{'output':<10} {'max abs diff':>12} {'max |source|':>12}  {'exact match':>11}  result"
        )
        played = (
            f", played as {self.sequences} sequences step by step (each side fed the state "
            "it returned)"
            if self.sequences
            else ""
        )
        lines = [
            f"parity on {self.samples} observations{played}",
            f"(pass: |onnx - source| <= {self.tolerance:g} * (1 + |source|); discrete actions "
            "exactly)",
            header,
        ]
        lines += [_line(row) for row in self.rows]
        verdict = "PASSED" if self.passed else "FAILED"
        lines.append(f"parity {verdict}")
        return "\n".join(lines)


def compare(
    source: PolicySource,
    run: Runner,
    observations: Observations,
    action_masks: np.ndarray | None,
    tolerance: float,
    seed: int,
) -> ParityReport:
    ours = run(graph_feeds(observations, action_masks))
    theirs = source.reference.outputs(observations, action_masks, None)
    sampled = (
        None
        if source.sampler is None
        else source.sampler.sampled_log_prob(observations, action_masks, None, seed)
    )
    return report(source, ours, theirs, sampled, tolerance)


def report(
    source: PolicySource,
    ours: dict[str, np.ndarray],
    theirs: dict[str, np.ndarray],
    sampled: SampledLogProb | None,
    tolerance: float,
    sequences: int = 0,
) -> ParityReport:
    """Every output's row, and the log-prob row when the source sampled, for the same rows."""
    specs = source.output_specs()
    rows = [_row(spec, ours[spec.name], theirs[spec.name], tolerance) for spec in specs]
    if sampled is not None:
        rows.append(_log_prob_row(source, sampled, ours, tolerance))
    return ParityReport(
        rows=rows, samples=len(ours["action"]), tolerance=tolerance, sequences=sequences
    )


def _row(spec: TensorSpec, ours: np.ndarray, theirs: np.ndarray, tolerance: float) -> ParityRow:
    theirs = np.asarray(theirs)
    if ours.shape != theirs.shape:
        return ParityRow(spec.name, float("inf"), float("nan"), None, passed=False)
    if spec.role is TensorRole.ACTION and spec.dtype == "int64":
        same = (ours == theirs).reshape(len(ours), -1).all(axis=1)
        diff, largest = _max_abs_diff(ours, theirs), _largest(theirs)
        return ParityRow(spec.name, diff, largest, float(same.mean()), passed=bool(same.all()))
    return _float_row(spec.name, ours, theirs, tolerance)


def _log_prob_row(
    source: PolicySource, sampled: SampledLogProb, ours: dict[str, np.ndarray], tolerance: float
) -> ParityRow:
    nvec = tuple(source.distribution.nvec) if source.distribution.nvec else None
    distribution = build(source.distribution.kind, ours, nvec)
    log_prob = distribution.log_prob(sampled.actions)
    return _float_row(LOG_PROB, log_prob, sampled.log_prob, tolerance)


def _float_row(name: str, ours: np.ndarray, theirs: np.ndarray, tolerance: float) -> ParityRow:
    diff = _abs_diff(ours, theirs)
    allowed = tolerance * (1.0 + np.abs(theirs.astype(np.float64)))
    passed = bool(np.all(diff <= allowed))
    return ParityRow(name, _max(diff), _largest(theirs), None, passed=passed)


def _abs_diff(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    return np.nan_to_num(diff, nan=np.inf)


def _max_abs_diff(ours: np.ndarray, theirs: np.ndarray) -> float:
    return _max(_abs_diff(ours, theirs))


def _max(values: np.ndarray) -> float:
    return float(values.max()) if values.size else 0.0


def _largest(values: np.ndarray) -> float:
    return _max(np.abs(values.astype(np.float64)))


def _line(row: ParityRow) -> str:
    exact = "-" if row.exact_match is None else f"{row.exact_match:.2%}"
    result = "pass" if row.passed else "FAIL"
    return f"{row.output:<10} {row.max_abs_diff:>12.3g} {row.largest:>12.3g}  {exact:>11}  {result}"
