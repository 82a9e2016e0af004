"""The "GPU path" section of docs/benchmarks.md, from one ``python -m bench.gpu`` run, and
its section-only rewrite of the document (the rest of it is kept as it is)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from bench.gpu_client import GpuSamples

if TYPE_CHECKING:
    from bench.gpu import FallbackCheck, GpuResults, LimitCheck, LoadPoint, Parity, ProviderRun

HEADING = "## GPU path (bench/gpu.sh)"
_LOAD_COLUMNS = (
    "| model | provider | rows/request | connections | requests/s | rows/s | p50 ms | p99 ms "
    "| errors | rows/batch | GPU busy, /metrics (mean / max) | GPU busy, /health (mean / max) "
    "| GPU memory used, max |"
)


def render(results: GpuResults) -> str:
    device = results.device
    driver = f", driver {device.driver}" if device.driver else ""
    count = f", {device.count} GPU{'s' if device.count != 1 else ''}" if device.count else ""
    lines = [
        HEADING,
        "",
        f"Written by `python -m bench.gpu` (`bash bench/gpu.sh`) on {results.when}.",
        "",
        f"- GPU: **{device.name}**{driver}{count}; {results.onnxruntime}, Python "
        f"{results.python}, {results.cpus} CPUs.",
        f"- Models: {' and '.join(f'`{m}`' for m in results.models)} of "
        "`bench/gpu_models.py` (the shapes of `bench/models.py`, built without torch), one "
        "`rlserve serve` process per provider run, `max_batch_size` 64.",
        f"- Load: `POST /v2/models/{{model}}/infer` with binary tensors, closed loop, "
        f"{results.warmup:g} s of warm-up then {results.seconds:g} s measured per point; "
        "latency at the client; GPU utilisation scraped twice a second while it ran.",
        "",
        "### /ready refuses a silent CPU fallback",
        "",
        "`CUDAExecutionProvider` requested with CUDA hidden (`CUDA_VISIBLE_DEVICES=` empty).",
        "",
        "| allow_cpu_fallback | /ready | reason | rlserve_provider_fallback | result |",
        "|---|---:|---|---:|---|",
        *(_fallback_row(check) for check in results.fallback),
        "",
        "### Providers",
        "",
        "| requested | active (rlserve_model_info) | measured |",
        "|---|---|---|",
        *(_provider_row(run) for run in results.runs),
        "",
        "### The memory limit reaches the CUDA arena",
        "",
        "A session built by `serve.execution.runtime` with `gpu_memory_limit_bytes`, in the "
        "benchmark's process: the options the CUDA provider reports.",
        "",
        "| requested | active | gpu_mem_limit | arena_extend_strategy | result |",
        "|---|---|---:|---|---|",
        *(_limit_row(run.limit) for run in results.runs if run.limit is not None),
        "",
        "### Answers against onnxruntime on the CPU",
        "",
        f"16 seeded observations per model; floats within {results.atol:g} (absolute); "
        "discrete actions equal wherever the CPU's two best logits are further apart.",
        "",
        "| model | provider | rows | largest difference | discrete actions | result |",
        "|---|---|---:|---|---|---|",
        *(_parity_row(p) for run in results.runs for p in run.parity),
        "",
        "### Throughput and latency",
        "",
        _LOAD_COLUMNS,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_load_row(point) for run in results.runs for point in run.load),
        "",
    ]
    return "\n".join(lines)


def _fallback_row(check: FallbackCheck) -> str:
    reason = "; ".join(check.reasons) or "none (ready)"
    flag = "n/a" if check.fallback_metric is None else f"{check.fallback_metric:g}"
    verdict = "pass" if check.passed else "**FAIL**"
    return (
        f"| {str(check.allow_cpu_fallback).lower()} | {check.status} | {_cell(reason)} | {flag} "
        f"| {verdict} |"
    )


def _provider_row(run: ProviderRun) -> str:
    active = ", ".join(f"{m}: {p}" for m, p in sorted(run.active.items())) or "none loaded"
    measured = "yes" if run.skipped is None else f"skipped: {_cell(run.skipped)}"
    if run.load_errors:
        measured += f" (onnxruntime could not load {_cell('; '.join(run.load_errors))})"
    return f"| {', '.join(run.requested)} | {active} | {measured} |"


def _limit_row(check: LimitCheck) -> str:
    registered = check.registered
    if not check.applies:
        verdict = "n/a (CUDA not active)"
    else:
        verdict = "pass" if check.passed else f"**FAIL** (asked for {check.limit})"
    return (
        f"| {', '.join(check.requested)} | {', '.join(check.active)} "
        f"| {registered.get('gpu_mem_limit', 'n/a')} "
        f"| {registered.get('arena_extend_strategy', 'n/a')} | {verdict} |"
    )


def _parity_row(parity: Parity) -> str:
    worst = ", ".join(f"{name} {value:.2g}" for name, value in parity.max_abs.items()) or "n/a"
    discrete = (
        f"{parity.action_mismatches} differ ({parity.near_ties} near ties)"
        if parity.discrete
        else "n/a (Box: compared as floats)"
    )
    verdict = "pass" if parity.passed else f"**FAIL**: {_cell('; '.join(parity.problems))}"
    return (
        f"| {parity.model} | {parity.provider} | {parity.rows} | {worst} | {discrete} | {verdict} |"
    )


def _load_row(point: LoadPoint) -> str:
    load = point.load
    per_batch = "n/a" if point.rows_per_batch is None else f"{point.rows_per_batch:.1f}"
    return (
        f"| {point.model} | {point.provider} | {point.rows} | {point.connections} "
        f"| {load.requests_per_s:,.0f} | {point.rows_per_s:,.0f} | {load.p50_ms:.2f} "
        f"| {load.p99_ms:.2f} | {load.errors_named} | {per_batch} "
        f"| {_busy(point.gpu.metrics_utilization)} | {_busy(point.gpu.health_utilization)} "
        f"| {_memory(point.gpu)} |"
    )


def _busy(values: list[float]) -> str:
    summary = GpuSamples.summary(values)
    return "n/a" if summary is None else f"{summary[0]:.0%} / {summary[1]:.0%}"


def _memory(samples: GpuSamples) -> str:
    return (
        f"{max(samples.memory_used_bytes) / 2**20:,.0f} MiB" if samples.memory_used_bytes else "n/a"
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_SECTION = re.compile(rf"(?ms)^{re.escape(HEADING)}\n.*?(?=^## |\Z)")


def section_of(document: str) -> str | None:
    """``document``'s GPU path section (up to the next ``## ``), if it has one: what a run of
    ``python -m bench``, which cannot measure it, carries over into the document it writes."""
    found = _SECTION.search(document)
    return None if found is None else found.group(0)


def splice(document: str, section: str) -> str:
    """``document`` with its GPU path section (up to the next ``## ``) replaced by
    ``section``; added before "Reading the numbers" (else at the end) when it has none."""
    section = section.rstrip("\n") + "\n\n"
    if _SECTION.search(document):
        return _SECTION.sub(lambda _: section, document, count=1).rstrip("\n") + "\n"
    if "\n## Reading the numbers" in document:
        return document.replace("\n## Reading the numbers", f"\n{section}## Reading the numbers", 1)
    return document.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"


def write(output: Path, section: str) -> None:
    """The section into ``output``: spliced into an existing document, else on its own."""
    document = output.read_text() if output.is_file() else "# Benchmarks\n"
    output.write_text(splice(document, section))
