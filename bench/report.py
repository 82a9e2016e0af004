"""docs/benchmarks.md from one run's results: header, targets, one table per section."""

from __future__ import annotations

import math

from bench import overload, scenarios, servers, targets
from bench.overload import GoodputRun, OverloadRun
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
    if results.overload is not None:
        parts.append(_overload_section(results.overload))
    parts.append(_READING)
    return "\n".join(parts)


def _header(c: Conditions) -> str:
    connections = sorted({s.connections for s in scenarios.WRK if s.name in c.scenarios})
    shown = ", ".join(map(str, reversed(connections))) or "none"
    chosen = "all" if c.all_scenarios else f"{', '.join(c.scenarios)} (chosen with `--only`)"
    overload_runs = (
        " (the overload scenario: its own connections, each run measured as long)"
        if scenarios.OVERLOAD in c.scenarios
        else ""
    )
    return (
        "# Benchmarks\n\n"
        f"Written by `python -m bench` on {c.when}.\n\n"
        f"- Machine: {c.machine}, {c.cpus} CPUs, Python {c.python}.\n"
        "- Pinning: every server on core 0 (`taskset -c 0`), except the row marked *not "
        "pinned*; the load generator (wrk with one thread, or the actor) on core 1 "
        "(`taskset -c 1`).\n"
        f"- Load: wrk connections {shown}; {c.warmup_s:g} s of warm-up, then {c.seconds:g} s "
        f"measured, per server and scenario{overload_runs}; unpinned gunicorn with "
        f"{c.workers} workers.\n"
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


def _overload_section(run: OverloadRun) -> str:
    peak, over = run.saturation, run.overload
    probe = over.probe
    verdict = targets.overload_verdict(run)
    deadline = (
        f"{run.deadline_ms:g} ms (`--deadline-ms`)"
        if run.deadline_given
        else f"{run.deadline_ms:g} ms ({overload.DEADLINE_SHARE:.0%} of {run.queue_ms:,.1f} ms)"
    )
    admitted = probe.admitted if probe else 0
    p99 = f"{run.admitted_p99_ms:,.1f} ms (of {admitted:,})" if admitted else "n/a (no 2xx)"
    lines = [
        f"## overload: goodput at saturation and at {overload.FACTOR}x (issue #9)",
        "",
        _OVERLOAD_METHOD.format(
            sweep=", ".join(map(str, overload.SWEEP)),
            factor=overload.FACTOR,
            probe=overload.PROBE_CONNECTIONS,
            share=f"{overload.DEADLINE_SHARE:.0%}",
            ramp=f"{overload.PROBE_RAMP_S:g}",
        ),
        "",
        f"| saturation goodput (C* = {peak.connections}; before, after) | overload goodput "
        f"({over.connections} connections) | ratio | admitted p99 (probe) | deadline "
        "| 429 | 503 | 504 | errors | target |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {run.saturation_goodput:,.0f} 2xx/s ({peak.goodput:,.0f}, {run.after.goodput:,.0f}) "
        f"| {over.goodput:,.0f} 2xx/s | {run.ratio:.0%} | {p99} "
        f"| {deadline} | {over.statuses.too_many:,} | {over.statuses.unavailable:,} "
        f"| {over.statuses.deadline:,} | {_errors(over)} | {verdict.status} |",
        "",
        _bound(run),
        "",
        "| run | connections | deadline ms | answers/s | goodput 2xx/s | 429 | 503 | 504 "
        "| errors | all answers p50 / p99 ms (wrk) | admitted p50 / p99 ms (probe) "
        "| late 2xx (probe) | server CPU µs/answer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_goodput_row(r, "saturation (C*)" if r is peak else "saturation") for r in run.sweep]
    lines.append(_goodput_row(over, f"overload ({overload.FACTOR}x C*)"))
    lines.append(_goodput_row(run.after, "saturation again (C*)"))
    return "\n".join(lines) + "\n"


def _bound(run: OverloadRun) -> str:
    """The overload run against the bound a closed loop sets (Little's law)."""
    over, n = run.overload, run.overload.connections
    spent_ms = n / over.answers_per_s * 1e3 if over.answers_per_s else math.inf
    needed = n / run.deadline_ms * 1e3
    text = (
        f"At {n} connections the server always holds {n} requests; at its peak rate it needs "
        f"{run.queue_ms:,.1f} ms to serve one of each, against a deadline of "
        f"{run.deadline_ms:g} ms. It answered {over.answers_per_s:,.0f} requests/s of any "
        f"status, so a request spent {spent_ms:,.1f} ms in it on average, served or refused; "
        f"admitted p99 within the deadline needs at least {needed:,.0f} answers/s "
        f"({n} ÷ {run.deadline_ms:g} ms)"
    )
    share = _refusal_share(run.deadline_ms / run.queue_ms, overload.MIN_RATIO)
    if share >= 1:
        return text + "."
    return text + (
        f", which a server spending {overload.MIN_RATIO:.0%} of its time on goodput reaches "
        f"only if a refusal costs at most {share:.0%} of a served request (less in practice: "
        "admitted requests also queue, and p99 is above the mean)."
    )


def _refusal_share(deadline_share: float, goodput_share: float) -> float:
    """The most a refusal may cost, as a share of a served request's cost, for a server
    that spends ``goodput_share`` of its time on goodput to answer N ÷ deadline requests/s
    when the deadline is ``deadline_share`` of N ÷ peak goodput: (1 - g) / (1/s - g)."""
    room = 1 / deadline_share - goodput_share
    return (1 - goodput_share) / room if room > 0 else math.inf


def _goodput_row(run: GoodputRun, label: str) -> str:
    deadline = "default" if run.deadline_ms is None else f"{run.deadline_ms:g}"
    probe = run.probe
    if probe is None:
        admitted, late = "n/a", "n/a"
    elif probe.admitted:
        admitted = f"{probe.percentile_ms(0.5):,.1f} / {probe.percentile_ms(0.99):,.1f}"
        late = f"{probe.late(run.deadline_ms or math.inf):,} of {probe.admitted:,}"
    else:
        admitted, late = "no 2xx", "n/a"
    load, statuses = run.load, run.statuses
    return (
        f"| {label} | {run.connections} | {deadline} | {run.answers_per_s:,.0f} "
        f"| {run.goodput:,.0f} | {statuses.too_many:,} | {statuses.unavailable:,} "
        f"| {statuses.deadline:,} | {_errors(run)} | {load.p50_ms:,.1f} / {load.p99_ms:,.1f} "
        f"| {admitted} | {late} | {run.cpu_us_per_answer:,.0f} |"
    )


def _errors(run: GoodputRun) -> str:
    failures = run.probe.failures if run.probe else 0
    return f"{run.errors + failures:,}"


_OVERLOAD_METHOD = """\
One `rlserve serve` process on core 0 serving the mlp model, for the whole scenario; wrk
and the probe on core 1.

- **Saturation**: closed-loop wrk at {sweep} connections with the model's default
  deadline. *Goodput* is 2xx answers per second; its peak is reached at C* connections.
- **Overload**: {factor} x C* connections for as long, every request carrying
  `X-Request-Timeout-Ms` (the deadline). Unless `--deadline-ms` is given, the deadline is
  {share} of the time the server needs at its peak rate to serve one request per overload
  connection: a server that queues them all answers every one too late.
- **Saturation again**: C* connections right after the overload, so that a change of the
  machine's speed during the run shows; the overload is judged against the mean of the
  two saturation goodputs.
- **"{factor}x"** is {factor} times the concurrency of peak goodput, not {factor} times its request
  rate. wrk is a closed loop that ignores Retry-After: a refused request is sent again at
  once, so the server always holds {factor} x C* requests and pays for every refusal. An
  open loop at {factor}x the peak rate cannot be generated here (wrk 4 has no rate mode; Python
  cannot send that fast from one core), and no single Python process could even refuse
  requests that fast.
- **Admitted latency** comes from a probe: {probe} of the overload connections are Python
  threads (`bench/probe.py`) that behave like wrk's but time each request from the client,
  from {ramp} s after the start to the end; the admitted p50/p99 are those of their 2xx
  answers, including the wait before the server reads a request. wrk's percentiles mix
  every status; so does the server's `rlserve_request_latency_seconds`, which also starts
  only when the handler sees the request.
- **Counts**: the statuses are wrk's; *errors* are socket errors, statuses other than
  2xx, 429, 503 and 504, and probe requests lost to a connection error. *Late 2xx* are the
  probe's 2xx answers slower than the deadline. *Server CPU µs/answer* is the server
  process's CPU time over the answers of any status.
- **The bound of a closed loop**: with N requests always in the server, a request spends
  N ÷ (answers per second) in it on average (Little's law), served or refused, and an
  admitted request waits as long as any other to be read. Admitted p99 within the
  deadline therefore needs at least N ÷ deadline answers per second of any status, which
  the server reaches only by refusing cheaply."""


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
