"""The Open Inference Protocol (KServe v2) under Triton's perf_analyzer: the ``oip`` scenario.

1. **Ceilings**: onnxruntime alone (bench/raw.py) on the server core, mlp and cnn, rows/s
   at batch 1 and at batch ``BATCH`` (rlserve's default largest batch), one intra-op
   thread, before any server starts.
2. **rlserve**: one ``rlserve serve --grpc-port`` process on the server core serving mlp
   and cnn for the whole scenario. perf_analyzer (bench/perf_analyzer.py) on the load core
   keeps ``CONCURRENCY`` requests in flight, one row per request, with zero-filled inputs
   (``--input-data zero``: its random FP32 data holds NaN and infinity bit patterns, which
   the policy refuses), for each model over every ``TRANSPORTS``: HTTP with binary tensors,
   HTTP with JSON tensors, gRPC unary (ModelInfer) and gRPC streaming (ModelStreamInfer);
   then over ``SHARED_MEMORY``: HTTP and gRPC streaming with the tensors in system
   shared-memory regions (Triton's extension, which the server is started to allow).
   perf_analyzer takes windows of ``--seconds`` / 3 (1 s at least) until the last three
   agree within ``STABILITY`` percent, ``MAX_TRIALS`` at most, and reports those three. It
   stops at the first error answer (a 429, a 504): such a run, or one that never
   stabilises, is recorded with perf_analyzer's message instead of numbers.
3. **The JSON predict path** of the same server, right after mlp's perf_analyzer runs:
   wrk with the mlp-64 scenario's body and connections on ``POST /v1/models/mlp/predict``,
   a warm-up run, then a measured one.
4. **A peer**, when given MLServer's executable (``--mlserver``, a virtual environment of
   its own with mlserver and onnxruntime): MLServer on the server core with a minimal
   onnxruntime runtime (bench/mlserver_runtime.py), driven by the same perf_analyzer runs.

Server CPU per request: the CPU time of the server's process tree over the whole
perf_analyzer invocation (its start-up, every window and the drain), divided by the
requests the server answered over the same interval, read from its own counter
(``rlserve_requests_total``; MLServer's ``model_infer_request_{success,failure}_total``)
scraped just before and after. perf_analyzer's own request count covers its last three
windows only, not the interval the CPU time covers. Rows per batch come from
``rlserve_batch_rows`` over the same interval.
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench import cpu, load, models, perf_analyzer, raw, scenarios, servers
from bench.load import LoadResult
from bench.perf_analyzer import PerfAnalyzerError, PerfResult, ProvisionError, UnstableMeasurement
from bench.servers import Server

ROOT = Path(__file__).resolve().parents[1]
MODELS = (models.MLP, models.CNN)
CONCURRENCY = 64  # perf_analyzer's requests in flight
BATCH = 32  # the ceiling's batch: rlserve's default --max-batch-size
MAX_TRIALS = 10  # perf_analyzer windows before it gives up stabilising
STABILITY = 10.0  # percent: the last three windows agree this closely
PREDICT = next(s for s in scenarios.WRK if s.name == "mlp-64")  # the JSON predict path's load
MLSERVER_BATCH_TIME_S = 0.001  # MLServer batches only with a wait above 0; rlserve waits 0

# targets (the issue): judged in bench/targets.py
MIN_CEILING_SHARE = 0.8  # cnn over gRPC or binary HTTP, against the ceiling at batch BATCH
MIN_GRPC_RATIO = 1.5  # mlp over gRPC, against the JSON predict path's requests/s

RLSERVE = "rlserve serve"
MLSERVER = "MLServer"
_RECORD = "bench-command:"  # the line the wrapper prints before perf_analyzer starts
# Prints the command it is given (perf_analyzer's, as bench/perf_analyzer.py built it),
# then becomes it: the exact command line, for the document.
_WRAPPER = ["sh", "-c", f'echo "{_RECORD} $*"; exec "$@"', "sh"]


@dataclass(frozen=True)
class Transport:
    key: str
    label: str
    protocol: Literal["http", "grpc"]
    binary: bool = True  # HTTP: binary tensor data; False: JSON tensors
    streaming: bool = False  # gRPC: ModelStreamInfer
    shared_memory: bool = False  # tensors in system shared-memory regions (Triton's extension)


HTTP_BINARY = Transport("http-binary", "HTTP `/v2`, binary tensors", "http")
HTTP_JSON = Transport("http-json", "HTTP `/v2`, JSON tensors", "http", binary=False)
GRPC_UNARY = Transport("grpc", "gRPC ModelInfer (unary)", "grpc")
GRPC_STREAM = Transport("grpc-stream", "gRPC ModelStreamInfer (streaming)", "grpc", streaming=True)
HTTP_SHM = Transport("http-shm", "HTTP `/v2`, system shared memory", "http", shared_memory=True)
GRPC_STREAM_SHM = Transport(
    "grpc-stream-shm",
    "gRPC ModelStreamInfer (streaming), system shared memory",
    "grpc",
    streaming=True,
    shared_memory=True,
)
TRANSPORTS = (HTTP_BINARY, HTTP_JSON, GRPC_UNARY, GRPC_STREAM)
SHARED_MEMORY = (HTTP_SHM, GRPC_STREAM_SHM)  # rlserve only: the peer has no such extension
GRPC = (GRPC_UNARY, GRPC_STREAM)
CEILING_TRANSPORTS = (GRPC_UNARY, GRPC_STREAM, HTTP_BINARY)  # the cnn target's
SHM_REGIONS = 1024  # perf_analyzer registers regions per request in flight


@dataclass(frozen=True)
class Ceiling:
    model: str
    rows_per_s_batch_1: float
    rows_per_s_batch: float  # at BATCH


@dataclass(frozen=True)
class Counted:
    """What the server's own counters say it did during one measurement."""

    server_cpu_s: float  # CPU seconds of its process tree
    answered: int | None  # requests answered, any status; None: its counter unreadable
    batches: int | None  # batches executed (rlserve only)

    @property
    def cpu_us_per_request(self) -> float | None:
        return self.server_cpu_s * 1e6 / self.answered if self.answered else None

    @property
    def rows_per_batch(self) -> float | None:
        return self.answered / self.batches if self.answered and self.batches else None


@dataclass(frozen=True)
class PerfRun:
    """One perf_analyzer invocation: a server, a model, a transport; numbers or why not."""

    server: str
    model: str
    transport: Transport
    result: PerfResult | None
    failure: str | None  # perf_analyzer's message when there is no result
    counted: Counted
    command: str  # perf_analyzer's command line

    @property
    def requests_per_s(self) -> float:
        return self.result.throughput if self.result else 0.0


@dataclass(frozen=True)
class PredictRun:
    """wrk on rlserve's JSON predict path, on the same server as the perf_analyzer runs."""

    load: LoadResult
    counted: Counted

    @property
    def cpu_us_per_request(self) -> float | None:
        if self.counted.answered:
            return self.counted.cpu_us_per_request
        return self.counted.server_cpu_s * 1e6 / self.load.requests if self.load.requests else None


@dataclass(frozen=True)
class OipRun:
    when: str
    seconds: float  # the whole scenario's wall time
    measurement_ms: int
    version: str  # perf_analyzer's
    ceilings: tuple[Ceiling, ...] = ()
    runs: tuple[PerfRun, ...] = ()
    predict: PredictRun | None = None
    peer: str | None = None  # MLServer's version when measured
    peer_note: str = ""  # why not, when not
    unavailable: str | None = None  # why nothing was measured (perf_analyzer not runnable)

    def find(self, model: str, transport: Transport, server: str = RLSERVE) -> PerfRun | None:
        for run in self.runs:
            if (run.server, run.model, run.transport) == (server, model, transport):
                return run
        return None

    def ceiling(self, model: str) -> Ceiling | None:
        return next((c for c in self.ceilings if c.model == model), None)

    def best(self, model: str, transports: tuple[Transport, ...]) -> PerfRun | None:
        """rlserve's fastest completed run of ``model`` over ``transports``."""
        done = [r for t in transports if (r := self.find(model, t)) and r.result is not None]
        return max(done, key=lambda r: r.requests_per_s, default=None)

    def representative(self) -> str:
        """One command line as run: cnn over gRPC streaming if it started, else any."""
        preferred = self.find(models.CNN.name, GRPC_STREAM)
        commands = [r.command for r in (preferred, *self.runs) if r is not None and r.command]
        return commands[0] if commands else ""


def run(
    repository: Path, workdir: Path, seconds: int, warmup: int, mlserver: Path | None
) -> OipRun:
    """The scenario on the mlp and cnn models of the benchmark ``repository``."""
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    measurement_ms = max(1000, seconds * 1000 // 3)
    try:
        prefix = perf_analyzer.ensure()
    except ProvisionError as exc:
        _say(f"  oip: perf_analyzer unavailable: {exc}")
        return OipRun(when, 0.0, measurement_ms, "", unavailable=str(exc))
    version = _version(prefix)
    ceilings = tuple(_ceiling(repository / m.name, min(seconds, 2)) for m in MODELS)
    runs, predict = _rlserve(prefix, repository, workdir, measurement_ms, seconds, warmup)
    peer, peer_runs, note = _mlserver(prefix, mlserver, repository, workdir, measurement_ms)
    return OipRun(
        when, time.monotonic() - started, measurement_ms, version, ceilings,
        (*runs, *peer_runs), predict, peer, note,
    )  # fmt: skip


def _version(prefix: list[str]) -> str:
    done = subprocess.run([*prefix, "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"Perf Analyzer Version (.+)", done.stdout + done.stderr)
    said = f"; its `--version`: {found.group(1).strip()}" if found else ""
    return f"perf-analyzer {perf_analyzer.VERSION} (the PyPI wheel{said})"


def _ceiling(model: Path, seconds: float) -> Ceiling:
    onnx = servers.newest_onnx(model)
    _say(f"  oip: {model.name}: onnxruntime ceiling")
    with cpu.on_core(cpu.SERVER_CORE):
        one = raw.rows_per_second(onnx, 1, seconds)
        batch = raw.rows_per_second(onnx, BATCH, seconds)
    return Ceiling(model.name, one, batch)


# --- the servers ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Endpoint:
    """A started server and where perf_analyzer and the counters reach it."""

    name: str
    server: Server
    grpc_port: int
    metrics_url: str
    answered: tuple[str, ...]  # the counter samples of answered requests
    batches: str | None  # the counter sample of executed batches


def _rlserve(
    prefix: list[str],
    repository: Path,
    workdir: Path,
    measurement_ms: int,
    seconds: int,
    warmup: int,
) -> tuple[list[PerfRun], PredictRun | None]:
    folder = workdir / "oip-repository"
    for model in MODELS:
        if not (folder / model.name).exists():
            shutil.copytree(repository / model.name, folder / model.name)
    grpc_port = servers.free_port()
    command = [
        sys.executable, "-m", "cli", "serve", "--model-repository", str(folder),
        "--grpc-port", str(grpc_port), "--allow-client-shm",
        "--shm-max-regions", str(SHM_REGIONS),
    ]  # fmt: skip
    _say(f"  oip: starting {RLSERVE} (HTTP and gRPC)")
    server = Server(command, {}, workdir / "oip-rlserve.log", cpu.SERVER_CORE)
    server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", 120)
    endpoint = _Endpoint(
        RLSERVE, server, grpc_port, f"{server.url}/metrics",
        ("rlserve_requests_total",), "rlserve_batch_rows_count",
    )  # fmt: skip
    runs: list[PerfRun] = []
    predict = None
    try:
        for model in MODELS:
            transports = (*TRANSPORTS, *SHARED_MEMORY)
            runs += [_perf(prefix, endpoint, model.name, t, measurement_ms) for t in transports]
            if model.name == PREDICT.model:
                predict = _predict(endpoint, seconds, warmup)
    finally:
        server.stop()
    return runs, predict


def _mlserver(
    prefix: list[str],
    executable: Path | None,
    repository: Path,
    workdir: Path,
    measurement_ms: int,
) -> tuple[str | None, list[PerfRun], str]:
    """MLServer's version, its runs, and a note on what was (not) measured."""
    if executable is None:
        return None, [], "no MLServer was given (`--mlserver`)"
    try:
        done = subprocess.run([str(executable), "--version"], capture_output=True, text=True)
    except OSError as exc:
        return None, [], f"`{executable} --version` failed: {exc}"
    if done.returncode != 0:
        return None, [], f"`{executable} --version` failed: {(done.stdout + done.stderr)[-300:]}"
    version = done.stdout.strip().replace("mlserver, version ", "MLServer ")
    python = executable.parent / "python"
    ort_version = subprocess.run(
        [str(python), "-c", "import onnxruntime; print(onnxruntime.__version__)"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if ort_version.returncode == 0:
        version += f" (onnxruntime {ort_version.stdout.strip()})"
    folder = _mlserver_folder(repository, workdir)
    grpc_port, metrics_port = servers.free_port(), servers.free_port()
    command = [
        "env", "MLSERVER_HTTP_PORT={port}", f"MLSERVER_GRPC_PORT={grpc_port}",
        f"MLSERVER_METRICS_PORT={metrics_port}", str(executable), "start", str(folder),
    ]  # fmt: skip
    _say(f"  oip: starting {version}")
    env = {"PYTHONPATH": str(ROOT)}  # bench.mlserver_runtime
    server = Server(command, env, workdir / "oip-mlserver.log", cpu.SERVER_CORE)
    try:
        server.wait_until(lambda c: c.get("/v2/health/ready").status_code == 200, "ready", 120)
    except (RuntimeError, TimeoutError) as exc:
        return None, [], f"{version} did not start: {str(exc)[-500:]}"
    endpoint = _Endpoint(
        MLSERVER, server, grpc_port, f"http://127.0.0.1:{metrics_port}/metrics",
        ("model_infer_request_success_total", "model_infer_request_failure_total"), None,
    )  # fmt: skip
    try:
        runs = [
            _perf(prefix, endpoint, m.name, t, measurement_ms) for m in MODELS for t in TRANSPORTS
        ]
    finally:
        server.stop()
    return version, runs, ""


def _mlserver_folder(repository: Path, workdir: Path) -> Path:
    """MLServer's settings, one model-settings.json per model, and the Triton model
    configurations perf_analyzer asks for (answered by bench/mlserver_runtime.py)."""
    folder, configs = workdir / "mlserver", workdir / "mlserver-configs"
    configs.mkdir(parents=True, exist_ok=True)
    settings = {"parallel_workers": 0, "debug": False, "host": "127.0.0.1"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps(settings))
    for model in MODELS:
        datatype = _DATATYPES[model.observation["dtype"].__name__]
        shape = list(model.observation["shape"])
        settings_file = folder / model.name / "model-settings.json"
        settings_file.parent.mkdir(exist_ok=True)
        settings_file.write_text(
            json.dumps(
                {
                    "name": model.name,
                    "implementation": "bench.mlserver_runtime.OnnxRuntime",
                    "parameters": {
                        "uri": str(servers.newest_onnx(repository / model.name)),
                        "version": "1",
                        "extra": {"configs": str(configs)},
                    },
                    "max_batch_size": BATCH,
                    "max_batch_time": MLSERVER_BATCH_TIME_S,
                    "inputs": [{"name": "obs", "datatype": datatype, "shape": [-1, *shape]}],
                }
            )
        )
        (configs / f"{model.name}.json").write_text(
            json.dumps(
                {
                    "name": model.name,
                    "platform": "onnxruntime_onnx",
                    "max_batch_size": BATCH,
                    "input": [{"name": "obs", "data_type": f"TYPE_{datatype}", "dims": shape}],
                    "output": [],  # perf_analyzer then asks for none: the server sends them all
                }
            )
        )
    return folder


_DATATYPES = {"float32": "FP32", "uint8": "UINT8"}


# --- one measurement ----------------------------------------------------------------------


def _perf(
    prefix: list[str], endpoint: _Endpoint, model: str, transport: Transport, measurement_ms: int
) -> PerfRun:
    _say(f"  oip: {endpoint.name}, {model}, {transport.key}")
    port = endpoint.grpc_port if transport.protocol == "grpc" else endpoint.server.port
    result, failure, output = None, None, ""
    before = _counts(endpoint, model)
    cpu_before = endpoint.server.cpu_seconds()
    try:
        result = perf_analyzer.run(
            [*_WRAPPER, *cpu.pinned(prefix, cpu.LOAD_CORE)],
            model=model,
            url=f"127.0.0.1:{port}",
            protocol=transport.protocol,
            concurrency=CONCURRENCY,
            measurement_ms=measurement_ms,
            streaming=transport.streaming,
            input_data="zero",
            binary=transport.binary,
            shared_memory=transport.shared_memory,
            stability_percentage=STABILITY,
            max_trials=MAX_TRIALS,
        )
        output = result.output
    except UnstableMeasurement as exc:
        failure = (
            f"unstable: no three of {MAX_TRIALS} windows of {measurement_ms} ms agreed within "
            f"{STABILITY:g}%"
        )
        output = exc.output
    except PerfAnalyzerError as exc:
        failure, output = _failure(exc), exc.output
    spent = endpoint.server.cpu_seconds() - cpu_before
    after = _counts(endpoint, model)
    if failure:
        _say(f"  oip: failed: {failure}")
        if endpoint.name == RLSERVE:  # MLServer's failures are expected: see the report
            print(endpoint.server.log_tail()[-1500:], file=sys.stderr, flush=True)
    return PerfRun(
        endpoint.name, model, transport, result, failure, _counted(spent, before, after),
        _command(output),
    )  # fmt: skip


def _predict(endpoint: _Endpoint, seconds: int, warmup: int) -> PredictRun:
    url = f"{endpoint.server.url}/v1/models/{PREDICT.model}/predict"
    body = scenarios.body(PREDICT)
    _say(f"  oip: {endpoint.name}, {PREDICT.model}, JSON predict path (wrk)")
    load.post(url, body, PREDICT.connections, warmup)
    before = _counts(endpoint, PREDICT.model)
    cpu_before = endpoint.server.cpu_seconds()
    result = load.post(url, body, PREDICT.connections, seconds)
    spent = endpoint.server.cpu_seconds() - cpu_before
    return PredictRun(result, _counted(spent, before, _counts(endpoint, PREDICT.model)))


def _counts(endpoint: _Endpoint, model: str) -> tuple[float, float] | None:
    """(answered, batches) so far for ``model`` from the server's metrics; None if unread."""
    try:
        text = httpx.get(endpoint.metrics_url, timeout=10).text
    except httpx.HTTPError:
        return None
    answered = batches = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name in endpoint.answered:
                answered += sample.value
            elif sample.name == endpoint.batches:
                batches += sample.value
    return answered, batches


def _counted(
    spent: float, before: tuple[float, float] | None, after: tuple[float, float] | None
) -> Counted:
    if before is None or after is None:
        return Counted(spent, None, None)
    answered, batches = (round(b - a) for a, b in zip(before, after, strict=True))
    return Counted(spent, answered, batches or None)


def _failure(exc: PerfAnalyzerError) -> str:
    """One line: how perf_analyzer ended and its first error line."""
    errors = [line.strip() for line in exc.output.splitlines() if "error" in line.lower()]
    detail = errors[0] if errors else " ".join(exc.output.split()[-30:])
    return f"{str(exc).splitlines()[0]}: {detail}"[:300]


def _command(output: str) -> str:
    """The command line the wrapper printed, paths under the project relative to it."""
    found = re.search(rf"(?m)^{_RECORD} (.+)$", output)
    return found.group(1).replace(f"{ROOT}/", "") if found else ""


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
