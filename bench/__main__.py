"""Side by side in one run: rlserve, a plain FastAPI app and raw onnxruntime (issue #8),
read against the HTTP floor, a bare ASGI app on uvicorn (issue #20), rlserve under
overload (issue #9), rlserve's Open Inference Protocol under perf_analyzer,
the inference side of RL training: rollout workers and experience buffers (issue #11),
language-model generation with continuous batching (issue #12), the result cache's hit
and miss paths against a model run (issue #13), and recurrent policies with client-held
and server-held state (issue #22).

    python -m bench [--seconds 8] [--only mlp-64,actor] [--output docs/benchmarks.md]

Servers run pinned to core 0 and the load (wrk, or the CartPole actor) to core 1, with
taskset. For each scenario every server gets a warm-up wrk run, then a measured one; the
server's cost per request is the CPU time of its process tree over the measured run. Every
deterministic wrk scenario runs the floor (bench/floor.py: read the body, answer a fixed
small JSON body, on uvicorn with rlserve serve's options) and plain FastAPI
(bench/baseline.py) before rlserve's setups, and the document divides rlserve's
requests/s, p50, p99 and CPU per request by theirs. `--only mlp-1,mlp-8,mlp-64
--seconds 2 --warmup 1` runs those three against all of them in about a minute and a half.
Scenarios (all by default):

  mlp-64, mlp-8, mlp-1                 mlp, one observation per request, deterministic
  mlp-stochastic-64, mlp-stochastic-8  mlp, sampled actions with log_probs and values
  cnn-64                               Nature-CNN, one 4x84x84 uint8 frame stack
  cartpole-64                          the bundled demo
  raw                                  onnxruntime alone, batch 1 and 32, every model
  actor                                a CartPole env stepped through rlserve serve
  overload                             goodput of rlserve serve (mlp) at saturation and at
                                       10x overload (issue #9), see below
  oip                                  the Open Inference Protocol (mlp, cnn) under Triton's
                                       perf_analyzer, see below
  loop                                 rollout workers through rlserve serve and experience
                                       buffers (issue #11), see below
  lm                                   generation from a DPO policy: rlserve serve at 1, 8
                                       and 32 streams against transformers and
                                       onnxruntime-genai (issue #12), see below
  cache                                the result cache (mlp, cnn): a hit and a miss
                                       against a model run (issue #13), see below
  recurrent                            64 sequences of a RecurrentPPO, client-held and
                                       server-held state (issue #22), see below
  features                             mlp observations by entity from Redis (both
                                       layouts) against inline (issue #24), see below
  grpo                                 GRPO through the server, co-located and
                                       decoupled (issue #26), see below
  lane                                 CartPole actors and a 64-env rollout worker over
                                       HTTP and over the local lane (issue #25), see below
  grpc                                 rlserve's gRPC calls against grpcio's own floor
                                       (issue #43), see below

overload: one rlserve serve process (mlp). Saturation: wrk at 8, 16, 32 and 64
connections; goodput = 2xx answers/s, its peak is reached at C* connections. Overload:
10 x C* connections for as long (a closed loop: a refused request is sent again at once,
Retry-After ignored), every request carrying X-Request-Timeout-Ms: --deadline-ms, by
default 80% of the time the server needs at its peak rate to serve one request per
connection, so that 10x is an overload. 8 of those connections are a probe timing the 2xx
answers from the client: the admitted p99. Then C* connections again, to see the machine's
drift. Target: overload goodput >= 80% of saturation goodput (the mean of before and
after) and admitted p99 <= the deadline. Takes 6 x --seconds + 2 x --warmup seconds, plus
exporting the model; `--only overload --seconds 8` about a minute.

oip (bench/oip.py): one rlserve serve process with --grpc-port (mlp and cnn); perf_analyzer
at 64 requests in flight over HTTP with binary and with JSON tensors, gRPC unary and gRPC
streaming, each model; wrk on the JSON predict path (mlp-64's body); the onnxruntime
ceiling at batch 32. Targets: cnn over gRPC or binary HTTP >= 80% of the ceiling, mlp over
gRPC >= 1.5x the JSON predict path. perf_analyzer is fetched once into .cache/perf_analyzer
(bench/perf_analyzer.py); when that fails the section says so and the rest of the run goes
on. --mlserver adds MLServer's rows. `--only oip --seconds 8` takes about five minutes.

loop (bench/loop.py): one rlserve serve process (cartpole) on core 0 and one rollout
worker (loop.collect.RolloutWorker) on core 1 at 1, 8 and 64 envs, publishing into an
in-process memory:// buffer that a drain thread empties: env steps/s, requests/s and the
worker's predict latency p50/p99. Then each buffer backend (memory, file, redis-server
with appendfsync everysec, noida-db as a Kafka broker; the servers on core 0, started by
the benchmark, a backend that cannot start is recorded and skipped): a producer publishing
batches of 64 steps at 2,000 steps/s and a consumer polling and committing (threads of one
process for memory://, two processes for the others, on core 1), publish-to-consume
latency p50/p99, then back-to-back throughput. Targets: > 40,000 steps/s at 64
envs, >= 2,000 steps/s with one env, buffer p99 < 5 ms (memory, file, redis), and the
reference criteria (inference p99 < 50 ms, > 1,000 frames/s, buffer p99 < 10 ms on every
backend). `--only loop --seconds 8` takes about 90 seconds.

lm (bench/lm.py): the tiny policies of examples/lm/tiny_policy.py (genuine TRL runs on a
Llama and a Qwen2 made from a config) built once into .cache/bench-lm; llama_dpo exported
with `rlserve export lm` (its parity gate included), its config.yaml raising the default
deadline and max_sequences to 32. 32 prompts of exactly 16 tokens; every engine generates
greedily and exactly 128 new tokens per request (`"ignore_eos": true` on the server).
transformers.generate one request after another and onnxruntime-genai's static batch of
8 (its model builder's export), each alone on core 0 with one thread; then rlserve serve
on core 0 and a streaming client (SSE, asyncio + httptools) on core 1 at 1, 8 and 32
closed-loop streams: tokens/s, TTFT p50/p99 and inter-token p99 at the client, and the
server's mean sequences per decoding step (its rlserve_lm_step_sequences histogram).
Then the TTFT test: a short request's TTFT on the idle server and while 7 long
generations (224 tokens) run, 5 times. Targets: at 8 streams >= 10x transformers
sequential and >= 40% of the genai batch of 8; TTFT under 7 running generations < 3x the
idle TTFT. `--only lm --seconds 8` takes about two minutes (the first run builds the
policies: half a minute more).

cache (bench/cache.py): one redis-server (in memory, maxmemory 256mb, allkeys-lru) on core
1 with wrk; for mlp and cnn, rlserve serve on core 0 without a cache and with result_cache
set, wrk at 1 and 64 connections: the model run (no cache, one fixed observation), the
cache hit (the same observation: every answer from Redis) and the cache miss (a new
observation every request: lookup, model run, write). Targets: cnn's hit p50 at one
connection below its model run's, and the hit rows' lookups no misses and >= 95% hits (the
rest counted Redis timeouts). `--only cache --seconds 8` takes under three minutes, plus
exporting the models.

recurrent (bench/recurrent.py): an untrained RecurrentPPO MlpLstmPolicy (64-unit LSTMs:
256 floats of state) exported with its parity gate; rlserve serve on core 0; wrk on core
1 with 64 threads of one connection each, one sequence per thread, one step in flight at
a time: client-held (each step carries the state the previous answer returned) and
server-held (each step carries its sequence_id). Target: server-held >= 80% of
client-held's requests/s. `--only recurrent --seconds 8` takes under a minute.

features (bench/features.py): redis-server (in memory) on core 1 holding 1,000 entities of
the mlp's 376 features as hashes and as packed float32 vectors; rlserve serve on core 0
serving the mlp without a view and with a view of each layout; wrk at 64 connections:
inline observations against entity ids. Reports the server's round trips to Redis (requests
per round trip) and each request's mean wait for its features. Target: by entity, p99
within 2 ms of inline. `--only features --seconds 8` takes about a minute.

grpo (bench/grpo.py): the tiny Llama base policy learns the toy task of
examples/grpo_task.py for 30 versions in each layout, as examples/grpo_colocated.py and
examples/grpo_decoupled.py run it: rollout tokens/s, trainer samples/s, the median weight
update (optimizer step to the new version serving) with its parts, and each side's share
of the wall-clock spent waiting. No targets: the figures are reported. `--only grpo` takes
about two minutes (plus building the tiny policies on a first run).

lane (bench/lane.py): rlserve serve --lane on core 0 serving the bundled CartPole policy;
on core 1, over HTTP (PolicyClient) and over the local lane (LaneClient), one after the
other: one actor (one env, one call per step), eight actors at once, and one rollout
worker with 64 envs (rlserve collect's code); beside them, the 64 envs stepped alone, and
the lane's floors: onnxruntime alone at batch 1 on core 0, and a bare shared-memory round
trip between two processes (bench.ipc's lane design). Targets (issue #43), through the
lane: one actor >= 12,000 env steps/s and >= 15% of onnxruntime's batch-1 rate alone,
eight actors >= 10,000 together, the 64-env worker >= 90% of its envs' rate alone.
`--only lane --seconds 8` takes about two minutes.

grpc (bench/grpc_floor.py): each server in turn on core 0, and a grpc.aio client on core
1 with 16 calls in flight (one stream each for the stream rows), one CartPole
observation per ModelInfer: grpcio's own floors (a grpc.aio unary echo and stream echo,
raw bytes in and out; its thread-pool server; grpclib when installed), then rlserve serve
--grpc-port over unary ModelInfer and over ModelStreamInfer. Target (issue #43): rlserve's
unary call <= 1.3x the grpc.aio echo's CPU per call. `--only grpc --seconds 5` takes about
a minute; `python -m bench.grpc_floor` prints the same table alone.

Needs wrk and taskset on PATH, two CPU cores, and the test install (torch and
stable-baselines3 build the mlp and cnn models; transformers, trl, peft and
onnxruntime-genai the lm scenario; redis-server the cache scenario). Writes
docs/benchmarks.md unless told otherwise. A run of every scenario writes the whole document
(keeping an existing GPU path section, which bench/gpu.sh measures); a subset into an
existing benchmarks document replaces only its own sections (each says under its heading
when and how it was measured), its rows of the Targets table and the reading notes,
keeping the rest of the document (`--only oip`, `--only loop`, `--only lm` or `--only
cache` alone: only that section, which says when it was measured). To write a subset's
own document, give --output a new file.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import (
    cache,
    cpu,
    features,
    gpu_report,
    grpc_floor,
    grpo,
    lane,
    lm,
    load,
    loop,
    models,
    oip,
    overload,
    raw,
    recurrent,
    report,
    scenarios,
    servers,
    targets,
)
from bench.actor import OVER_HTTP, ActorResult, Client
from bench.results import ActorRun, Conditions, LoadRun, RawRun, Results
from bench.scenarios import Scenario
from bench.servers import Server, Setup
from cli.arguments import add_arguments, arg, from_namespace

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
            "run only these scenarios: one name, or several separated by commas, and the "
            f"flag may repeat (default: all; names: {', '.join(scenarios.NAMES)})",
            metavar="SCENARIO[,SCENARIO...]",
        ),
    )
    deadline_ms: float | None = field(
        default=None,
        metadata=arg(
            "overload: the deadline every overload request carries (X-Request-Timeout-Ms); "
            f"default: {overload.DEADLINE_SHARE * 100:.0f}%% of the time the "
            "server needs at its peak rate to serve one request per overload connection"
        ),
    )
    mlserver: Path | None = field(
        default=None,
        metadata=arg(
            "oip: the mlserver executable of a virtual environment of its own with mlserver "
            "and onnxruntime; adds MLServer's rows (default: none)",
            metavar="PATH",
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
    if args.deadline_ms is not None and args.deadline_ms <= 0:
        parser.error("--deadline-ms takes a positive number of milliseconds")
    try:
        chosen = scenarios.chosen(args.only)
    except ValueError as e:
        parser.error(str(e))
    cpu.require_cores()
    quiet = (scenarios.RAW, scenarios.ACTOR, scenarios.LOOP, scenarios.LM, scenarios.GRPO)
    if any(n not in quiet for n in chosen):
        load.require_wrk()
    results = Results(_conditions(args, chosen))
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        _run(args, chosen, results, Path(tmp))
    _write(args.output, results, chosen)


def _run(args: BenchArgs, chosen: tuple[str, ...], results: Results, workdir: Path) -> None:
    """Every chosen scenario, in the document's order, into ``results``."""
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
    if scenarios.OVERLOAD in chosen:
        _say(f"{overload.MODEL}: overload against rlserve serve")
        results.overload = overload.run(
            repository / overload.MODEL, workdir, args.seconds, args.warmup, args.deadline_ms
        )
    _run_peers(args, chosen, results, repository, workdir)


def _run_peers(
    args: BenchArgs, chosen: tuple[str, ...], results: Results, repository: Path, workdir: Path
) -> None:
    """The scenarios with sections of their own: OIP, the RL loop, LMs, the result cache,
    recurrent policies."""
    if scenarios.OIP in chosen:
        _say("mlp, cnn: Open Inference Protocol (perf_analyzer)")
        results.oip = oip.run(repository, workdir, args.seconds, args.warmup, args.mlserver)
    if scenarios.LOOP in chosen:
        _say("cartpole: RL loop (rollout workers, experience buffers)")
        results.loop = loop.run(repository / "cartpole", workdir, args.seconds, args.warmup)
    if scenarios.LM in chosen:
        _say("llama_dpo: language-model generation (continuous batching)")
        results.lm = lm.run(workdir, args.seconds, args.warmup)
    if scenarios.CACHE in chosen:
        _say("mlp, cnn: the result cache against a model run")
        results.cache = cache.run(repository, workdir, args.seconds, args.warmup)
    if scenarios.RECURRENT in chosen:
        _say("recurrent: 64 sequences, client-held and server-held state")
        results.recurrent = recurrent.run(workdir, args.seconds, args.warmup)
    if scenarios.FEATURES in chosen:
        _say("mlp: observations by entity from Redis, against inline")
        results.features = features.run(repository, workdir, args.seconds, args.warmup)
    if scenarios.GRPO in chosen:
        _say("tiny Llama: GRPO through the server, co-located and decoupled")
        results.grpo = grpo.run(workdir)
    if scenarios.LANE in chosen:
        _say("cartpole: actors and a rollout worker over HTTP and over the local lane")
        results.lane = lane.run(repository / "cartpole", workdir, args.seconds, args.warmup)
    if scenarios.GRPC in chosen:
        _say("cartpole: gRPC calls against grpcio's own floor")
        results.grpc = grpc_floor.run(args.seconds)


def _write(output: Path, results: Results, chosen: tuple[str, ...]) -> None:
    """The document. A run of every scenario (or into a new file) writes it whole, keeping
    only an existing GPU path section and the figures measured in tests; a subset into an
    existing benchmarks document replaces only its own sections and Targets rows (``--only
    oip``, ``loop``, ``lm`` or ``cache`` alone: that section alone, which says when it was
    measured)."""
    verdicts = targets.judge(results)
    old = output.read_text() if output.is_file() else None
    if old is not None and chosen != scenarios.NAMES:
        spliced = _splice(old, results, verdicts, chosen)
        if spliced is not None:
            output.write_text(spliced)
            _say(f"replaced the {', '.join(chosen)} sections of {output}, keeping the rest")
            return
    document = report.render(results, verdicts)
    if old is not None:  # figures recorded from tests, not by this run
        document = report.keep_sections(document, old)
    kept = gpu_report.section_of(old) if old is not None else None
    if kept is not None:  # measured by bench/gpu.sh on a GPU machine, not by this run
        document = gpu_report.splice(document, kept)
    output.write_text(document)
    _say(f"wrote {output}" + ("" if kept is None else ", keeping its GPU path section"))


def _splice(
    old: str, results: Results, verdicts: list[targets.Verdict], chosen: tuple[str, ...]
) -> str | None:
    """``old`` with this subset run's sections in it; None when it is no benchmarks document."""
    if len(chosen) == 1 and chosen[0] in scenarios.SPLICED:
        own: list[tuple[Any, Callable[[str, Any, list[targets.Verdict]], str | None]]] = [
            (results.oip, report.splice_oip),
            (results.loop, report.splice_loop),
            (results.lm, report.splice_lm),
            (results.cache, report.splice_cache),
            (results.recurrent, report.splice_recurrent),
            (results.features, report.splice_features),
            (results.grpo, report.splice_grpo),
            (results.lane, report.splice_lane),
            (results.grpc, report.splice_grpc),
        ]
        for run, splice in own:
            if run is not None:
                return splice(old, run, verdicts)
    return report.splice_subset(old, results, verdicts)


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
        return [_actor(args, server, client) for client in OVER_HTTP]
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
