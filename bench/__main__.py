"""Side by side in one run: rlserve, a plain FastAPI app and raw onnxruntime (issue #8).

    python -m bench [--seconds 8] [--only mlp-64 --only actor] [--output docs/benchmarks.md]

Servers run pinned to core 0 and the load (wrk, or the CartPole actor) to core 1, with
taskset. For each scenario every server gets a warm-up wrk run, then a measured one; the
server's cost per request is the CPU time of its process tree over the measured run.
Scenarios (all by default):

  mlp-64, mlp-8, mlp-1                 mlp, one observation per request, deterministic
  mlp-stochastic-64, mlp-stochastic-8  mlp, sampled actions with log_probs and values
  cnn-64                               Nature-CNN, one 4x84x84 uint8 frame stack
  cartpole-64                          the bundled demo
  raw                                  onnxruntime alone, batch 1 and 32, every model
  actor                                a CartPole env stepped through rlserve serve

Needs wrk and taskset on PATH, two CPU cores, and the test install (torch and
stable-baselines3 build the mlp and cnn models). Writes docs/benchmarks.md unless told
otherwise; a document from a subset says which scenarios it holds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench import cpu, load, models, raw, report, scenarios, servers, targets
from bench.actor import ActorResult, Client
from bench.results import ActorRun, Conditions, LoadRun, RawRun, Results
from bench.scenarios import Scenario
from bench.servers import Server, Setup
from serve.cli.arguments import add_arguments, arg, from_namespace

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class BenchArgs:
    seconds: int = field(
        default=8, metadata=arg("measured seconds per server and scenario (1 for a smoke test)")
    )
    warmup: int = field(default=2, metadata=arg("seconds of warm-up load before each run"))
    workers: int = field(
        default=2, metadata=arg("workers of the unpinned gunicorn row (throughput scaling)")
    )
    only: list[str] | None = field(
        default=None,
        metadata=arg(
            "run only this scenario; repeat for several (default: all)",
            choices=list(scenarios.NAMES),
            metavar="SCENARIO",
        ),
    )
    output: Path = field(
        default=ROOT / "docs" / "benchmarks.md", metadata=arg("markdown file to write")
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser, BenchArgs)
    args = from_namespace(BenchArgs, parser.parse_args())
    if args.seconds < 1 or args.warmup < 1:
        parser.error("--seconds and --warmup take whole seconds, 1 at least (wrk's -d)")
    chosen = tuple(n for n in scenarios.NAMES if args.only is None or n in args.only)
    cpu.require_cores()
    load.require_wrk()
    results = Results(_conditions(args, chosen))
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        workdir = Path(tmp)
        repository = models.build_repository(
            workdir / "repository", scenarios.bench_models(list(chosen))
        )
        for model in scenarios.MODELS:
            picked = [s for s in scenarios.WRK if s.model == model and s.name in chosen]
            results.load += _load_runs(args, repository / model, picked, workdir)
        if scenarios.RAW in chosen:
            results.raw = [_raw(repository / m, min(args.seconds, 2)) for m in scenarios.MODELS]
        if scenarios.ACTOR in chosen:
            results.actor = _actor_runs(args, repository / "cartpole", workdir)
    args.output.write_text(report.render(results, targets.judge(results)))
    _say(f"wrote {args.output}")


def _conditions(args: BenchArgs, chosen: tuple[str, ...]) -> Conditions:
    return Conditions(
        when=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=platform.machine(),
        cpus=os.cpu_count() or 0,
        python=platform.python_version(),
        seconds=args.seconds,
        warmup_s=args.warmup,
        workers=args.workers,
        scenarios=chosen,
        all_scenarios=chosen == scenarios.NAMES,
    )


def _load_runs(
    args: BenchArgs, model: Path, picked: list[Scenario], workdir: Path
) -> list[LoadRun]:
    """Every picked scenario of one model, one server setup at a time (started once)."""
    order: dict[str, Setup] = {}
    for scenario in picked:
        order.update((s.key, s) for s in scenarios.setups(scenario, args.workers))
    runs: list[LoadRun] = []
    for setup in order.values():
        mine = [s for s in picked if setup in scenarios.setups(s, args.workers)]
        probe = scenarios.body(mine[0])
        _say(f"{model.name}: starting {setup.label}")
        server = servers.start(setup, model, workdir, probe)
        try:
            runs += [_measure(args, server, setup, scenario) for scenario in mine]
        finally:
            server.stop()
    return sorted(runs, key=lambda r: (picked.index(r.scenario), list(order).index(r.setup.key)))


def _measure(args: BenchArgs, server: Server, setup: Setup, scenario: Scenario) -> LoadRun:
    url, body = f"{server.url}/predict", scenarios.body(scenario)
    _say(f"  {scenario.name}: {setup.label}")
    load.post(url, body, scenario.connections, args.warmup)
    before = server.cpu_seconds()
    result = load.post(url, body, scenario.connections, args.seconds)
    spent = server.cpu_seconds() - before
    if result.requests == 0 or result.errors:
        _say(f"  {result.requests} requests, {result.errors} errors; server log:")
        print(server.log_tail(), file=sys.stderr, flush=True)
    return LoadRun(scenario, setup, result, spent)


def _raw(model: Path, seconds: float) -> RawRun:
    onnx = servers.newest_onnx(model)
    _say(f"{model.name}: raw onnxruntime")
    with cpu.on_core(cpu.SERVER_CORE):
        one, batch = raw.rows_per_second(onnx, 1, seconds), raw.rows_per_second(onnx, 32, seconds)
    return RawRun(model.name, one, batch)


def _actor_runs(args: BenchArgs, model: Path, workdir: Path) -> list[ActorRun]:
    _say("cartpole: actor against rlserve serve")
    server = servers.start(servers.SERVE, model, workdir)
    try:
        return [_actor(args, server, client) for client in Client]
    finally:
        server.stop()


def _actor(args: BenchArgs, server: Server, client: Client) -> ActorRun:
    command = [
        sys.executable, "-m", "bench.actor", "--url", server.url, "--client", client.value,
        "--seconds", str(args.seconds), "--warmup", str(min(args.warmup, 1)),
    ]  # fmt: skip
    _say(f"  actor: {client.value} client")
    before = server.cpu_seconds()
    done = subprocess.run(
        cpu.pinned(command, cpu.LOAD_CORE), capture_output=True, text=True, cwd=ROOT
    )
    spent = server.cpu_seconds() - before
    if done.returncode != 0:
        raise RuntimeError(f"bench.actor failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return ActorRun(ActorResult(**json.loads(done.stdout.splitlines()[-1])), spent)


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
