"""docs/benchmarks.md from one run's results: header, targets, one table per section."""

from __future__ import annotations

from bench import scenarios, servers
from bench.results import Conditions, LoadRun, Results
from bench.targets import Verdict

_SECTIONS = {
    "mlp": (
        "mlp: one observation per request, deterministic",
        "376 float observations (seeded random), 256x256 actor and critic, 17 actions.",
    ),
    "mlp-stochastic": (
        "mlp: stochastic, with log_probs and values",
        'The same observation with `"deterministic": false` and `"outputs": ["actions", '
        '"log_probs", "values"]`. The baseline cannot answer this; each row is compared with '
        "the deterministic row of the same setup and connections.",
    ),
    "cnn": (
        "cnn: one image observation per request",
        "Nature-CNN on 4x84x84 uint8 frames sent as nested JSON lists (about 100 KB a "
        "request), 6 discrete actions.",
    ),
    "cartpole": (
        "cartpole: the bundled demo",
        "A 64x64 MLP on 4 floats: per-request HTTP and Python work dominate.",
    ),
}
_LOAD_COLUMNS = "| setup | connections | requests/s | p50 ms | p99 ms | errors | CPU µs/request |"


def render(results: Results, verdicts: list[Verdict]) -> str:
    parts = [_header(results.conditions), _targets(verdicts)]
    for section in dict.fromkeys(s.section for s in scenarios.WRK):
        runs = [r for r in results.load if r.scenario.section == section]
        if runs:
            parts.append(_load_section(section, runs, results))
    if results.raw:
        parts.append(_raw_section(results))
    if results.actor:
        parts.append(_actor_section(results))
    parts.append(_READING)
    return "\n".join(parts)


def _header(c: Conditions) -> str:
    connections = sorted({s.connections for s in scenarios.WRK if s.name in c.scenarios})
    shown = ", ".join(map(str, reversed(connections))) or "none"
    chosen = "all" if c.all_scenarios else f"{', '.join(c.scenarios)} (chosen with `--only`)"
    return (
        "# Benchmarks\n\n"
        f"Written by `python -m bench` on {c.when}.\n\n"
        f"- Machine: {c.machine}, {c.cpus} CPUs, Python {c.python}.\n"
        "- Pinning: every server on core 0 (`taskset -c 0`), except the row marked *not "
        "pinned*; the load generator (wrk with one thread, or the actor) on core 1 "
        "(`taskset -c 1`).\n"
        f"- Load: wrk connections {shown}; {c.warmup_s:g} s of warm-up, then {c.seconds:g} s "
        f"measured, per server and scenario; unpinned gunicorn with {c.workers} workers.\n"
        f"- Scenarios: {chosen}.\n\n"
        "All numbers come from this one run: compare ratios within it, not across machines "
        "or runs.\n"
    )


def _targets(verdicts: list[Verdict]) -> str:
    lines = ["## Targets", "", "| target | measured | result |", "|---|---:|---|"]
    lines += [f"| {v.target} | {v.measured} | {v.status} |" for v in verdicts]
    return "\n".join(lines) + "\n"


def _load_section(section: str, runs: list[LoadRun], results: Results) -> str:
    title, intro = _SECTIONS[section]
    versus = "vs deterministic" if runs[0].scenario.stochastic else "vs baseline"
    lines = [
        f"## {title}",
        "",
        intro,
        "",
        f"{_LOAD_COLUMNS} {versus} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        load = run.load
        lines.append(
            f"| {run.setup.label} | {run.scenario.connections} | {load.requests_per_s:,.0f} "
            f"| {load.p50_ms:.2f} | {load.p99_ms:.2f} | {load.errors} "
            f"| {run.cpu_us_per_request:,.0f} | {_versus(run, results)} |"
        )
    return "\n".join(lines) + "\n"


def _versus(run: LoadRun, results: Results) -> str:
    """Requests/s against the baseline (or the deterministic twin) of the same connections."""
    if run.scenario.stochastic:
        reference = results.find(scenarios.deterministic_twin(run.scenario), run.setup.key)
    else:
        reference = results.find(run.scenario.name, servers.BASELINE.key)
    if reference is None or reference.load.requests_per_s == 0:
        return "n/a"
    return f"{run.load.requests_per_s / reference.load.requests_per_s:.2f}x"


def _raw_section(results: Results) -> str:
    lines = [
        "## Raw onnxruntime",
        "",
        "Back-to-back `session.run` calls in one thread on core 0, one intra-op thread, no "
        "server: the ceiling for one core.",
        "",
        "| model | rows/s at batch 1 | rows/s at batch 32 |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {r.model} | {r.rows_per_s_batch_1:,.0f} | {r.rows_per_s_batch_32:,.0f} |"
        for r in results.raw
    ]
    return "\n".join(lines) + "\n"


def _actor_section(results: Results) -> str:
    lines = [
        "## CartPole actor",
        "",
        "One Python process on core 1 steps one CartPole-v1 env with actions from rlserve "
        "serve (core 0, cartpole model), one request per step, resetting when an episode "
        "ends (`bench/actor.py`). *policy* is the project's client (`serve.client."
        "PolicyClient`); *http* a bare `http.client` keep-alive connection: the client's "
        "own cost is the difference.",
        "",
        "| client | env steps/s | steps | episodes | server CPU µs/step |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.actor.client} | {r.actor.steps_per_s:,.0f} | {r.actor.steps:,} "
        f"| {r.actor.episodes:,} | {r.cpu_us_per_step:,.0f} |"
        for r in results.actor
    ]
    return "\n".join(lines) + "\n"


_READING = """## Reading the numbers

- **Setups**: *plain FastAPI* parses the body and runs onnxruntime inline on its event
  loop, one request per run, with no validation, batching, deadlines or metrics
  (`bench/baseline.py`); *rlserve serve* is the development server (one process);
  *rlserve gunicorn* is the production configuration (`serve/gunicorn.conf.py`), with one
  worker pinned like the others, and with several workers free to use every core. Access
  logs are off everywhere.
- **Pinning**: each server has core 0 to itself and wrk has core 1, so a server's
  throughput is what one core gives it, and the load generator never competes with it.
  The *not pinned* gunicorn row shares core 1 with wrk: it shows how throughput scales
  with workers, not a cost.
- **CPU µs/request** is the CPU time (user + system) of the server's whole process tree
  during the measured run, read from the kernel before and after, divided by the requests
  wrk completed: the server's own work per request, whatever else ran on the machine.
  It includes what batching saves, so it falls as batches fill.
- **Closed loop**: each wrk connection sends its next request when the previous answer
  arrives, so at 64 connections every server is saturated and the latency percentiles
  include queueing; at 1 connection they are the latency of one request on an idle
  server. For latency at a target request rate use the open-loop load test
  (`docs/loadtests.md`).
- **Ratios only within one run**: the machine, its other tenants and its frequency
  scaling change from run to run; comparing servers measured minutes apart on the same
  cores is meaningful, comparing this document with another run's is not.
"""
