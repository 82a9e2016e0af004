"""The GPU path, measured: rlserve serve on the CUDA provider (and TensorRT where it loads).

    bash bench/gpu.sh   # on a machine with an NVIDIA GPU: installs, then runs this module
    python -m bench.gpu [--seconds 4] [--batch 1 --batch 64] [--model mlp] [--output FILE]
    python -m bench.gpu --provider CPUExecutionProvider --allow-cpu --output /tmp/gpu.md

needs no torch: the mlp and cnn benchmark policies are built by ``bench/gpu_models.py``
(``onnx`` only). In order:

1. **Fallback refused**: a server asked for ``CUDAExecutionProvider`` with CUDA hidden
   (``CUDA_VISIBLE_DEVICES=`` empty) must keep ``/ready`` at 503 with the fallback as its
   reason, and turn ready with ``allow_cpu_fallback``.
2. For each provider run (``CUDAExecutionProvider``; then ``TensorrtExecutionProvider``
   before CUDA when this onnxruntime offers it, skipped with the server's reason when it
   does not load): one ``rlserve serve`` with both models, ``max_batch_size`` 64; the
   provider each version runs on, from ``rlserve_model_info``.
   **Memory limit**: in this process, ``serve.execution.runtime`` builds the mlp's session
   on the same providers with ``gpu_memory_limit_bytes`` (256 MiB): the CUDA provider must
   report ``gpu_mem_limit`` at that figure and ``kSameAsRequested`` (also after TensorRT's
   fallback to CUDA, where TensorRT does not load).
3. **Answers**: 16 seeded observations per model through ``/v2/models/{m}/infer`` against
   onnxruntime on the CPU on the same file: values, logits, means (and Box actions) within
   ``--atol`` (absolute); discrete actions identical wherever the CPU's two best logits
   are more than ``--atol`` apart.
4. **Load**: rows per request 1, 8, 32, 64 (binary tensors, ``bench/gpu_client.py``), a
   closed loop with ``max(4, 128 / rows)`` connections so that batches fill, ``--warmup``
   then ``--seconds`` measured: requests/s, rows/s, P50/P99 at the client, the server's
   mean rows per batch (``rlserve_batch_rows``), and the GPU utilisation scraped twice a
   second from ``/metrics`` (``rlserve_gpu_utilization_ratio``) and ``/health``
   (``gpu_utilization``) while the load runs.

Prints a Markdown section and writes it into ``--output`` (docs/benchmarks.md) under the
heading "GPU path", replacing only that section. Exits 2 without a GPU (unless
``--allow-cpu``), 1 when the fallback check or an answer check fails or a run without
TensorRT did not load (a skipped run reports the libraries onnxruntime could not load).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort

from bench import gpu_client, gpu_models, gpu_report
from bench.gpu_client import GpuSamples, LoadResult
from bench.gpu_models import GpuBenchModel
from bench.servers import Server
from cli.arguments import add_arguments, arg, from_namespace
from serve import config
from serve.execution import runtime

ROOT = Path(__file__).resolve().parents[1]
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
CPU = "CPUExecutionProvider"
BATCHES = (1, 8, 32, 64)
MAX_BATCH_SIZE = 64
PARITY_ROWS = 16
LIMIT = 256 << 20  # gpu_memory_limit_bytes of the limit check
# Loading both models, warm-up included; TensorRT builds an engine per warmed batch size, and
# a run that has not loaded by then is reported as skipped (the script's budget is 8 minutes).
READY_TIMEOUT_S = 150
NO_GPU = (
    "no NVIDIA GPU: nvidia-smi is missing or lists no GPU; this script measures the CUDA "
    "path; run it on a GPU machine"
)
# Served output -> the graph output it comes from.
_GRAPH_OUTPUT = {"actions": "action", "values": "value", "logits": "logits", "mean": "mean"}


@dataclass
class GpuArgs:
    provider: list[str] | None = field(
        default=None,
        metadata=arg(
            "an execution provider to measure, repeat for several runs (default: "
            f"{CUDA}, then {TENSORRT} before it where this onnxruntime offers it)",
            metavar="PROVIDER",
        ),
    )
    allow_cpu: bool = field(
        default=False,
        metadata=arg("run without a GPU (the CPU provider), to try the benchmark itself"),
    )
    seconds: float = field(default=4.0, metadata=arg("measured seconds per model and batch"))
    warmup: float = field(default=1.0, metadata=arg("seconds of load before each measurement"))
    batch: list[int] | None = field(
        default=None,
        metadata=arg("rows per request, repeat (default: 1, 8, 32, 64)", metavar="ROWS"),
    )
    model: list[str] | None = field(
        default=None,
        metadata=arg(
            "benchmark policy, repeat (default: mlp and cnn)",
            choices=[m.name for m in gpu_models.MODELS],
            metavar="MODEL",
        ),
    )
    atol: float = field(default=1e-4, metadata=arg("absolute tolerance of the answer check"))
    output: Path = field(
        default=ROOT / "docs" / "benchmarks.md",
        metadata=arg("Markdown file whose GPU path section is written"),
    )


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Device:
    name: str  # "NVIDIA H100 80GB HBM3", or "no GPU" with --allow-cpu
    driver: str | None
    count: int


@dataclass(frozen=True)
class FallbackCheck:
    allow_cpu_fallback: bool
    status: int
    reasons: list[str]
    fallback_metric: float | None  # rlserve_provider_fallback, mlp

    @property
    def passed(self) -> bool:
        if self.allow_cpu_fallback:
            return self.status == 200 and self.fallback_metric == 1
        refused = any("is not running on requested" in r and CUDA in r for r in self.reasons)
        return self.status == 503 and refused and self.fallback_metric == 1


@dataclass(frozen=True)
class LimitCheck:
    requested: list[str]
    limit: int
    active: list[str]
    registered: dict[str, str]  # the options the CUDA provider reports

    @property
    def applies(self) -> bool:
        return CUDA in self.active

    @property
    def passed(self) -> bool:
        strategy = self.registered.get("arena_extend_strategy")
        return not self.applies or (
            self.registered.get("gpu_mem_limit") == str(self.limit)
            and strategy in ("kSameAsRequested", "1")
        )


@dataclass(frozen=True)
class Parity:
    model: str
    provider: str
    rows: int
    max_abs: dict[str, float]  # served output -> largest |served - CPU|
    action_mismatches: int  # discrete actions differing where the CPU's best two logits are apart
    near_ties: int  # rows whose best two CPU logits are within the tolerance
    problems: list[str]
    discrete: bool = False  # the actions are indices, compared exactly

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class LoadPoint:
    model: str
    provider: str
    rows: int  # per request
    connections: int
    load: LoadResult
    rows_per_batch: float | None
    gpu: GpuSamples

    @property
    def rows_per_s(self) -> float:
        return self.load.ok * self.rows / self.load.seconds if self.load.seconds else 0.0


@dataclass
class ProviderRun:
    requested: list[str]
    active: dict[str, str] = field(default_factory=dict)  # model -> provider it runs on
    skipped: str | None = None  # why it was not measured
    load_errors: list[str] = field(default_factory=list)  # libraries onnxruntime could not load
    limit: LimitCheck | None = None
    parity: list[Parity] = field(default_factory=list)
    load: list[LoadPoint] = field(default_factory=list)


@dataclass
class GpuResults:
    when: str
    device: Device
    onnxruntime: str
    python: str
    cpus: int
    seconds: float
    warmup: float
    atol: float
    models: list[str] = field(default_factory=list)
    fallback: list[FallbackCheck] = field(default_factory=list)
    runs: list[ProviderRun] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """The fallback refused, every answer right, and every run measured but TensorRT's
        (whose libraries are not part of the install)."""
        return (
            all(f.passed for f in self.fallback)
            and all(p.passed for r in self.runs for p in r.parity)
            and all(r.limit.passed for r in self.runs if r.limit is not None)
            and all(r.skipped is None for r in self.runs if TENSORRT not in r.requested)
        )


# ---------------------------------------------------------------------------- pure parts


def compare(
    model: str,
    provider: str,
    expected: dict[str, np.ndarray],
    served: dict[str, np.ndarray],
    atol: float,
) -> Parity:
    """The served outputs against onnxruntime's on the CPU (``expected``, by graph output
    name): floats within ``atol``; discrete actions equal where the CPU's logits decide."""
    problems: list[str] = []
    max_abs: dict[str, float] = {}
    mismatches = ties = 0
    rows = 0
    discrete = False
    for name, graph_name in _GRAPH_OUTPUT.items():
        if name not in served or graph_name not in expected:
            continue
        got, want = served[name], expected[graph_name]
        rows = len(want)
        if got.shape != want.shape:
            problems.append(f"{name}: shape {got.shape}, CPU {want.shape}")
            continue
        if want.dtype.kind in "iu":
            discrete = True
            mismatches, ties = _discrete(got, want, expected.get("logits"), atol)
            if mismatches:
                problems.append(
                    f"{name}: {mismatches} of {rows} differ where the CPU's logits are more "
                    f"than {atol:g} apart"
                )
            continue
        worst = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
        max_abs[name] = worst
        if not worst <= atol:
            problems.append(f"{name}: differs from the CPU by {worst:.3g} (> {atol:g})")
    if not max_abs and not problems:
        problems.append("no output to compare")
    return Parity(model, provider, rows, max_abs, mismatches, ties, problems, discrete)


def _discrete(
    got: np.ndarray, want: np.ndarray, logits: np.ndarray | None, atol: float
) -> tuple[int, int]:
    """(mismatches that count, rows too close to call) of discrete actions."""
    if logits is None:
        return int(np.sum(got != want)), 0
    ordered = np.sort(logits, axis=-1)
    close = (ordered[..., -1] - ordered[..., -2]) <= atol
    differ = got != want
    return int(np.sum(differ & ~close)), int(np.sum(close))


def load_errors(log: str) -> list[str]:
    """The libraries onnxruntime says it could not load, in a server's log, each once."""
    found = re.findall(r"Failed to load library \S*?([^/\s]+\.so) with error: ([^\n\x1b]+)", log)
    return list(dict.fromkeys(f"{library}: {error.strip()}" for library, error in found))


def connections_for(rows: int) -> int:
    """Enough closed-loop connections that batches reach max_batch_size."""
    return max(4, 2 * MAX_BATCH_SIZE // rows)


def gpu_device() -> Device | None:
    """The machine's NVIDIA GPUs, as nvidia-smi lists them; None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = [line.split(", ") for line in done.stdout.strip().splitlines() if line.strip()]
    if done.returncode != 0 or not gpus:
        return None
    names = sorted({g[0] for g in gpus})
    return Device(" + ".join(names), gpus[0][1] if len(gpus[0]) > 1 else None, len(gpus))


# ---------------------------------------------------------------------------- runs


def _server(repository: Path, workdir: Path, label: str, env: dict[str, str]) -> Server:
    command = [sys.executable, "-m", "cli", "serve", "--model-repository", str(repository)]
    settings = {"RLSERVE_MAX_BATCH_SIZE": str(MAX_BATCH_SIZE), **env}
    return Server(command, settings, workdir / f"gpu-{label}.log", core=None)


def _settled(client: httpx.Client) -> bool:
    """/ready has a verdict: ready, or refusing for a reason other than still loading."""
    ready = client.get("/ready")
    return ready.status_code == 200 or "loading models" not in ready.json().get("reasons", [])


def _wait_settled(server: Server, timeout_s: float) -> httpx.Response:
    server.wait_until(_settled, "done loading", timeout_s)
    return httpx.get(f"{server.url}/ready", timeout=5)


def fallback_checks(repository: Path, workdir: Path) -> list[FallbackCheck]:
    """A server told to use CUDA with CUDA hidden: refused readiness, then allowed."""
    checks = []
    for allowed in (False, True):
        env = {
            "CUDA_VISIBLE_DEVICES": "",
            "RLSERVE_PROVIDERS": json.dumps([CUDA]),
            "RLSERVE_ALLOW_CPU_FALLBACK": str(allowed).lower(),
        }
        _say(f"fallback check: {CUDA} with CUDA hidden, allow_cpu_fallback={allowed}")
        server = _server(repository, workdir, f"fallback-{allowed}", env)
        try:
            ready = _wait_settled(server, 120)
            metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        finally:
            server.stop()
        flags = gpu_client.metric_values(metrics, "rlserve_provider_fallback")
        reasons = ready.json().get("reasons", []) if ready.status_code != 200 else []
        checks.append(
            FallbackCheck(allowed, ready.status_code, reasons, max(flags) if flags else None)
        )
    return checks


def provider_run(
    providers: list[str],
    repository: Path,
    models: list[GpuBenchModel],
    args: GpuArgs,
    workdir: Path,
) -> ProviderRun:
    run = ProviderRun(providers)
    label = "+".join(p.removesuffix("ExecutionProvider") for p in providers)
    _say(f"{label}: starting rlserve serve")
    server = _server(repository, workdir, label, {"RLSERVE_PROVIDERS": json.dumps(providers)})
    try:
        try:
            ready = _wait_settled(server, READY_TIMEOUT_S)
        except (TimeoutError, RuntimeError) as exc:  # too slow to load, or exited: stopped
            run.skipped = str(exc).splitlines()[0]
            run.load_errors = load_errors(server.log.read_text())
            _say(f"{label}: skipped: {run.skipped}")
            return run
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        run.active = {
            labels["model"]: labels["provider"]
            for labels in gpu_client.metric_labels(metrics, "rlserve_model_info")
        }
        if ready.status_code != 200:
            run.skipped = (
                "; ".join(ready.json().get("reasons", [])) or f"/ready {ready.status_code}"
            )
            run.load_errors = load_errors(server.log.read_text())
            _say(f"{label}: not ready, skipped: {run.skipped}")
            return run
        run.limit = limit_check(providers, repository / models[0].name / "1" / "model.onnx", LIMIT)
        for model in models:
            run.parity.append(_parity(server.url, repository, model, label, args.atol))
            for rows in args.batch or BATCHES:
                run.load.append(_load_point(server.url, model, label, rows, args))
    finally:
        server.stop()
    return run


def limit_check(providers: list[str], model: Path, limit: int) -> LimitCheck:
    """The memory limit as the CUDA provider registered it, for a session built by the server's
    own code on ``providers``."""
    settings = config.load(providers=providers, gpu_memory_limit_bytes=limit)
    session = runtime.create_session(model, settings, f"{model.parent.parent.name} (limit check)")
    registered = session.provider_options().get(CUDA, {})
    keys = ("gpu_mem_limit", "arena_extend_strategy")
    return LimitCheck(
        providers,
        limit,
        list(session.report.active),
        {k: registered[k] for k in keys if k in registered},
    )


def _parity(url: str, repository: Path, model: GpuBenchModel, label: str, atol: float) -> Parity:
    observations = model.observations(PARITY_ROWS, seed=7)
    path = repository / model.name / "1" / "model.onnx"
    session = ort.InferenceSession(str(path), providers=[CPU])
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(names, {"obs": observations}), strict=True))
    wanted = [n for n, g in _GRAPH_OUTPUT.items() if g in expected]
    with httpx.Client(base_url=url, timeout=30) as client:
        served = gpu_client.infer(client, model.name, {"obs": observations}, wanted)
    parity = compare(model.name, label, expected, served, atol)
    _say(f"{label}: {model.name} answers {'match' if parity.passed else 'DIFFER'} {parity.max_abs}")
    return parity


def _load_point(url: str, model: GpuBenchModel, label: str, rows: int, args: GpuArgs) -> LoadPoint:
    connections = connections_for(rows)
    _say(f"{label}: {model.name}, {rows} rows per request, {connections} connections")
    inputs = {"obs": model.observations(rows, seed=rows)}
    body, headers = gpu_client.infer_body(inputs, ["actions", "values"], binary_outputs=True)
    path = f"/v2/models/{model.name}/infer"

    async def measure() -> tuple[LoadResult, GpuSamples, tuple[float, float]]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            load = asyncio.create_task(
                gpu_client.closed_loop(
                    url, path, body, headers, connections, args.warmup, args.seconds
                )
            )
            await asyncio.sleep(args.warmup)
            before = gpu_client.batch_rows((await client.get("/metrics")).text, model.name)
            samples = await gpu_client.sample_gpu(url, time.perf_counter() + args.seconds)
            after = gpu_client.batch_rows((await client.get("/metrics")).text, model.name)
            result = await load
        return result, samples, (after[0] - before[0], after[1] - before[1])

    load, samples, (batch_rows, batches) = asyncio.run(measure())
    per_batch = batch_rows / batches if batches else None
    return LoadPoint(model.name, label, rows, connections, load, per_batch, samples)


# ---------------------------------------------------------------------------- main


def _runs(args: GpuArgs) -> list[list[str]]:
    if args.provider:
        return [[p] for p in args.provider]
    runs = [[CUDA]]
    if TENSORRT in ort.get_available_providers():
        runs.append([TENSORRT, CUDA])
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser, GpuArgs)
    args = from_namespace(GpuArgs, parser.parse_args(argv))
    if args.seconds <= 0 or args.warmup <= 0:
        parser.error("--seconds and --warmup take a positive number of seconds")
    if any(rows < 1 or rows > MAX_BATCH_SIZE for rows in args.batch or BATCHES):
        parser.error(f"--batch takes rows per request from 1 to {MAX_BATCH_SIZE}")
    runs = _runs(args)
    device = gpu_device()
    if device is None:
        if not args.allow_cpu:
            print(f"bench.gpu: {NO_GPU} (or pass --allow-cpu)", file=sys.stderr)
            return 2
        device = Device("no GPU (CPU provider, --allow-cpu)", None, 0)
    if any(CPU in r for r in runs) and not args.allow_cpu:
        parser.error(f"{CPU} measures no GPU: add --allow-cpu to run it anyway")
    chosen = [m for m in gpu_models.MODELS if args.model is None or m.name in args.model]
    results = GpuResults(
        when=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        device=device,
        onnxruntime=_onnxruntime_version(),
        python=platform.python_version(),
        cpus=os.cpu_count() or 0,
        seconds=args.seconds,
        warmup=args.warmup,
        atol=args.atol,
        models=[m.name for m in chosen],
    )
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        workdir = Path(tmp)
        repository = gpu_models.build_repository(workdir / "repository", tuple(chosen))
        only_first = gpu_models.build_repository(workdir / "fallback", (chosen[0],))
        results.fallback = fallback_checks(only_first, workdir)
        results.runs = [provider_run(r, repository, chosen, args, workdir) for r in runs]
    section = gpu_report.render(results)
    print(section)
    gpu_report.write(args.output, section)
    _say(f"wrote the GPU path section of {args.output}")
    if not results.passed:
        _say("FAILED: see the fallback check, the providers and the answers above")
        return 1
    return 0


def _onnxruntime_version() -> str:
    from importlib import metadata

    for dist in ("onnxruntime-gpu", "onnxruntime"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return f"onnxruntime {ort.__version__}"


def _say(message: str) -> None:
    print(f"bench.gpu: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
