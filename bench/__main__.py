"""Server throughput against raw onnxruntime and a plain FastAPI app, in one run.

    python -m bench [--seconds 8] [--connections 64]

Needs wrk on PATH and the test install (torch builds the wide model). Writes the table
to docs/benchmarks.md. Ratios are only meaningful within one run: machines are noisy.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench import load, raw
from serve.cli.arguments import add_arguments, arg, from_namespace
from tests.e2e.conftest import DEMO, export_untrained
from tests.e2e.server import Server

ROOT = Path(__file__).resolve().parents[1]
OBSERVATION = {"observations": [0.01, -0.02, 0.03, 0.04]}


@dataclass
class BenchArgs:
    seconds: float = field(default=8.0, metadata=arg("seconds of load per server"))
    connections: int = field(default=64, metadata=arg("concurrent connections (wrk)"))
    workers: int = field(default=2, metadata=arg("gunicorn workers"))
    output: Path = field(
        default=ROOT / "docs" / "benchmarks.md", metadata=arg("markdown file to write")
    )


@dataclass
class Row:
    setup: str
    result: load.LoadResult


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    add_arguments(parser, BenchArgs)
    args = from_namespace(BenchArgs, parser.parse_args())
    load.require_wrk()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repository"
        shutil.copytree(DEMO, repo / "cartpole")
        print("building the wide model (PPO MlpPolicy, 2x1024 hidden)", file=sys.stderr)
        export_untrained(Path(tmp), repo, "wide", "CartPole-v1", [1024, 1024])
        sections = [_model_section(args, repo, name, Path(tmp)) for name in ("cartpole", "wide")]
    args.output.write_text(_document(args, sections))
    print(f"wrote {args.output}", file=sys.stderr)


def _model_section(args: BenchArgs, repo: Path, name: str, tmp: Path) -> str:
    model = repo / name / "1" / "model.onnx"
    print(f"{name}: raw onnxruntime", file=sys.stderr)
    raw_1, raw_32 = raw.rows_per_second(model, 1), raw.rows_per_second(model, 32)
    single = _only(repo, name, tmp)
    rows = [
        Row("plain FastAPI, ORT inline per request", _measure(args, _baseline(model, tmp))),
        Row("rlserve serve (1 process)", _measure(args, _rlserve(single, tmp))),
        Row(
            f"rlserve gunicorn ({args.workers} workers)",
            _measure(args, _gunicorn(single, tmp, args.workers)),
        ),
    ]
    return _table(name, raw_1, raw_32, rows)


def _only(repo: Path, name: str, tmp: Path) -> Path:
    single = tmp / f"only-{name}"
    if not single.exists():
        shutil.copytree(repo / name, single / name)
    return single


def _baseline(model: Path, tmp: Path) -> Server:
    command = [
        sys.executable, "-m", "uvicorn", "--factory", "bench.baseline:create_app",
        "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    server = Server(command, {"BASELINE_MODEL": str(model)}, tmp / "baseline.log")
    server.wait_until(
        lambda c: c.post("/predict", json=OBSERVATION).status_code == 200, 60, "serving"
    )
    return server


def _rlserve(repo: Path, tmp: Path) -> Server:
    env = {"RLSERVE_ACCESS_LOG": "false", "RLSERVE_LOG_LEVEL": "warning"}
    server = Server.rlserve(repo, env=env, log=tmp / "rlserve.log")
    server.wait_ready(120)
    return server


def _gunicorn(repo: Path, tmp: Path, workers: int) -> Server:
    env = {
        "RLSERVE_MODEL_REPOSITORY": str(repo),
        "RLSERVE_WORKERS": str(workers),
        "RLSERVE_ACCESS_LOG": "false",
        "RLSERVE_LOG_LEVEL": "warning",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp / f"metrics-{workers}"),
    }
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "--config",
        str(ROOT / "serve" / "gunicorn.conf.py"),
    ]
    server = Server(command, env, tmp / "gunicorn.log")
    server.wait_ready(120)
    return server


def _measure(args: BenchArgs, server: Server) -> load.LoadResult:
    try:
        load.post(f"{server.url}/predict", OBSERVATION, args.connections, 2)  # warm
        return load.post(f"{server.url}/predict", OBSERVATION, args.connections, args.seconds)
    finally:
        server.stop()


def _table(name: str, raw_1: float, raw_32: float, rows: list[Row]) -> str:
    baseline = rows[0].result.requests_per_s
    lines = [
        f"### {name}",
        "",
        f"Raw onnxruntime on one thread: {raw_1:,.0f} rows/s at batch 1, "
        f"{raw_32:,.0f} rows/s at batch 32.",
        "",
        "| setup | requests/s | p50 ms | p99 ms | errors | vs plain FastAPI | vs raw ORT batch 1 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        r = row.result
        lines.append(
            f"| {row.setup} | {r.requests_per_s:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} "
            f"| {r.errors} "
            f"| {r.requests_per_s / baseline:.2f}x | {r.requests_per_s / raw_1:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def _document(args: BenchArgs, sections: list[str]) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "# Benchmarks",
        "",
        f"Written by `python -m bench` ({when}) on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}. Load: wrk, {args.connections} connections, "
        f"{args.seconds:g} s per server, one observation per request. All numbers come from "
        "one run;",
        "compare ratios within it, not across machines.",
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(sections) + "\n" + _READING


_READING = """## Reading the numbers

- **Rows**: *plain FastAPI* parses the body and runs onnxruntime inline on the event loop,
  one request per run, with no validation, batching, deadlines or metrics (`bench/baseline.py`);
  *rlserve serve* is the development server (one process, uvicorn); *rlserve gunicorn* is the
  production configuration (`serve/gunicorn.conf.py`). Access logs are off in all of them.
- **vs raw ORT batch 1** compares HTTP requests per second with back-to-back in-process
  `session.run` calls on one row: the cost of the whole request path.
- **cartpole** (a 64x64 MLP, microseconds per run) is bound by per-request HTTP and Python
  work: batching saves little compute, and rlserve's validation, bookkeeping and thread hop
  cost some throughput against the bare baseline in one process; two workers use both cores.
- **wide** (2x1024 hidden units) is bound by the model: the baseline runs it once per request,
  on its event loop; rlserve runs one batch for many requests, off the loop, and serves more
  requests per second from the same cores.
- wrk keeps 64 connections busy (a closed loop): every server here is saturated, so latency
  percentiles include queueing. For latency at a target rate use the open-loop load test
  (`docs/loadtests.md`).
"""


if __name__ == "__main__":
    main()
