"""``rlserve collect``: a rollout worker that turns served actions into experience.

Progress goes to stderr every few seconds; the summary goes to stdout as one JSON object
when the worker stops (``--steps`` reached, SIGTERM or SIGINT). Exit status 0 after a
clean stop, 2 for bad input or when the server or the buffer kept failing for
``--retry-for-s`` (see ``loop.collect`` for what is guaranteed then).

Light on purpose: ``rlserve --help`` imports this module; gymnasium, msgpack and the buffer
clients are imported inside ``run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from cli.arguments import add_arguments as add_dataclass_arguments
from cli.arguments import arg, from_namespace
from kernel.errors import ConfigError

if TYPE_CHECKING:
    from loop.buffers.base import BufferOptions
    from loop.collect import Counters, Vectorization

T = TypeVar("T")

NAME = "collect"
HELP = (
    "rollout worker for RL training: step gymnasium envs with actions sampled by a server, "
    "publish every step to an experience buffer (not `rollout`, the blue-green release tool)"
)
EXTRA = "loop"

_DESCRIPTION = (
    "Run a rollout worker: NUM_ENVS copies of ENV step together; each iteration sends all "
    "their observations to the server in one predict request (sampled actions, with "
    "log-probs and values), steps the envs, and publishes one experience record per env, "
    "stamped with the version that answered. A server restart or swap and a full or "
    "unreachable buffer are retried for --retry-for-s without losing or duplicating steps. "
    "Several workers may feed one buffer. SIGTERM or SIGINT stops the worker within 2 s, "
    "whatever the buffer is doing: records it did not take are counted (unaccepted in the "
    "summary), and a requested stop exits 0. (`rlserve rollout` is something else: "
    "blue-green releases on Kubernetes.)"
)
_EXAMPLE = (
    "examples:\n"
    "  rlserve collect --env CartPole-v1 --server http://127.0.0.1:8000 \\\n"
    "      --buffer file:///tmp/experience --num-envs 8 --seed 0 --steps 100000\n"
    "  rlserve collect --env CartPole-v1 --server http://rlserve:8000 --model cartpole \\\n"
    "      --buffer 'redis://redis:6379/0?stream=rl_experience' --num-envs 64\n"
    "  rlserve collect --config configs/decoupled_config.yaml --config configs/sync_policy.yaml"
)


@dataclass(kw_only=True)
class CollectArgs:
    config: list[str] | None = field(
        default=None,
        metadata=arg(
            "the loop's YAML config (loop/config.py; repeat to merge several, later wins; "
            "RLSERVE_LOOP_* variables apply on top): env, server, buffer and the options below "
            "come from it unless given as flags (default: $RLSERVE_LOOP_CONFIG_FILE, if set)",
            metavar="FILE",
        ),
    )
    env: str | None = field(
        default=None,
        metadata=arg(
            "gymnasium environment id, e.g. CartPole-v1 (default: rollout.env_id from --config)",
            metavar="ENV_ID",
        ),
    )
    server: str | None = field(
        default=None,
        metadata=arg(
            "the rlserve server to ask for actions, e.g. http://127.0.0.1:8000 (default: "
            "inference_cluster.endpoint from --config)",
            metavar="URL",
        ),
    )
    buffer: str | None = field(
        default=None,
        metadata=arg(
            "experience buffer to publish to: memory://NAME (in-process; only useful from "
            "Python), file:///DIR (a local log for a trainer on this machine), "
            "redis://HOST:PORT/DB?stream=NAME, kafka://HOST:PORT/TOPIC?partitions=N "
            "(default: the producer URL of --config's data_buffer)",
            metavar="URL",
        ),
    )
    num_envs: int | None = field(
        default=None,
        metadata=arg(
            "environments stepped together, all asked for in one request (default: 8, or "
            "rollout.num_envs from --config)",
            metavar="N",
        ),
    )
    seed: int | None = field(
        default=None,
        metadata=arg(
            "seeds the envs' resets and the server's action sampling (a seed per request, "
            "drawn from it), for a reproducible run; give each worker its own (default: "
            "rollout.seed from --config, else fresh randomness, and requests without a seed, "
            "which the server serves faster)",
            metavar="N",
        ),
    )
    model: str | None = field(
        default=None,
        metadata=arg(
            "model to ask (default: inference_cluster.model from --config, else the server's "
            "default model)",
            metavar="NAME",
        ),
    )
    lane: str | None = field(
        default=None,
        metadata=arg(
            "the server's local lane (rlserve serve --lane PATH), when this worker runs on the "
            "server's host: actions come through shared memory instead of HTTP, and over "
            "--server's HTTP if the lane is not there or goes away (default: "
            "inference_cluster.lane from --config, else HTTP only)",
            metavar="PATH",
        ),
    )
    steps: int | None = field(
        default=None,
        metadata=arg(
            "stop after this many env steps, in whole iterations (default: run until SIGTERM "
            "or SIGINT)",
            metavar="N",
        ),
    )
    worker_id: str | None = field(
        default=None,
        metadata=arg(
            "names this worker in episode ids, which are WORKER_ID-RUN-ENV-EPISODE with a "
            "fresh RUN each start, so a restarted worker never repeats one (default: "
            "HOSTNAME-PID)",
            metavar="ID",
        ),
    )
    retry_for_s: float | None = field(
        default=None,
        metadata=arg(
            "how long to keep retrying a failing server (connection refused, 429, 503, 504) "
            "or a full or unreachable buffer before giving up (default: 60, or "
            "rollout.retry_for_s from --config)",
            metavar="SECONDS",
        ),
    )
    vectorization: str | None = field(
        default=None,
        metadata=arg(
            "auto: the env's own vectorised implementation when it has one (fast), else "
            "sync; sync: all envs in this process; async: one subprocess per env (for "
            "expensive envs) (default: auto, or rollout.vectorization from --config)",
            choices=["auto", "sync", "async"],
        ),
    )
    no_episode_reports: bool = field(
        default=False,
        metadata=arg(
            "do not report finished episodes' returns to the server (by default each is sent, "
            "in batches, for the version that served it: the per-version return metrics and "
            "a policy canary's evidence, docs/rollouts.md); the server's episode_token, if it "
            "has one, is read from RLSERVE_EPISODE_TOKEN"
        ),
    )
    progress_every_s: float = field(
        default=5.0, metadata=arg("seconds between progress lines on stderr", metavar="SECONDS")
    )
    metrics_port: int | None = field(
        default=None,
        metadata=arg(
            "serve Prometheus metrics (rl_env_steps_total, rl_experience_published_total, "
            "rl_episode_return ...) on this port (default: none)",
            metavar="PORT",
        ),
    )
    logdir: str | None = field(
        default=None,
        metadata=arg(
            "TensorBoard event files here, one point per progress line: tensorboard "
            "--logdir runs (default: runs/collect-<worker id>-<date>-<time>; none: no event "
            "files)",
            metavar="DIR",
        ),
    )


@dataclass(frozen=True)
class Resolved:
    """What a worker runs with: the flags, else the loop's config, else the defaults."""

    env: str
    server: str
    buffer: str
    num_envs: int
    seed: int | None
    model: str | None
    retry_for_s: float
    vectorization: str
    buffer_options: BufferOptions | None
    lane: str | Path | None


def resolve(args: CollectArgs) -> Resolved:
    """Flags first; then, with --config (or RLSERVE_LOOP_CONFIG_FILE), the loop's config."""
    from loop import config as loop_config

    files = args.config or []
    if not files and not os.environ.get(loop_config.ENV_PREFIX + "CONFIG_FILE"):
        missing = [f"--{n}" for n in ("env", "server", "buffer") if getattr(args, n) is None]
        if missing:
            raise ConfigError(
                f"rlserve collect needs {', '.join(missing)}, or a --config file that gives "
                "them (rollout.env_id, inference_cluster.endpoint, data_buffer)"
            )
        assert args.env is not None
        assert args.server is not None
        assert args.buffer is not None
        return Resolved(
            env=args.env, server=args.server, buffer=args.buffer,
            num_envs=_first(args.num_envs, 8), seed=args.seed, model=args.model,
            retry_for_s=_first(args.retry_for_s, 60.0),
            vectorization=_first(args.vectorization, "auto"), buffer_options=None,
            lane=args.lane,
        )  # fmt: skip
    loaded = loop_config.load(*files)
    rollout = loaded.rollout
    return Resolved(
        env=_first(args.env, rollout.env_id),
        server=_first(args.server, loaded.server_url()),
        buffer=_first(args.buffer, loaded.producer_buffer_url()),
        num_envs=_first(args.num_envs, rollout.num_envs),
        seed=_first(args.seed, rollout.seed),
        model=_first(args.model, loaded.inference_cluster.model),
        retry_for_s=_first(args.retry_for_s, rollout.retry_for_s),
        vectorization=_first(args.vectorization, rollout.vectorization),
        buffer_options=loaded.buffer_options(),
        lane=_first(args.lane, loaded.inference_cluster.lane),
    )


def _first(flag: T | None, fallback: T) -> T:
    return fallback if flag is None else flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = textwrap.fill(_DESCRIPTION, width=78)
    parser.epilog = _EXAMPLE
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_dataclass_arguments(parser, CollectArgs)


def run(namespace: argparse.Namespace) -> int:
    from loop.collect import RolloutWorker
    from loop.scalars import Scalars, logdir_of

    args = from_namespace(CollectArgs, namespace)
    given = resolve(args)
    with RolloutWorker(
        given.env,
        given.server,
        given.buffer,
        num_envs=given.num_envs,
        seed=given.seed,
        model=given.model,
        worker_id=args.worker_id,
        retry_for_s=given.retry_for_s,
        vectorization=cast("Vectorization", given.vectorization),  # argparse or pydantic checked it
        buffer_options=given.buffer_options,
        lane=given.lane,
        report_episodes=not args.no_episode_reports,
        episode_token=os.environ.get("RLSERVE_EPISODE_TOKEN"),
    ) as worker:
        _progress(
            f"worker {worker.worker_id}-{worker.run_id}: {given.num_envs} x {given.env} "
            f"-> {given.buffer}, asking {given.server}"
            + (f" (local lane {given.lane})" if given.lane else "")
        )
        if args.metrics_port is not None:
            from loop.worker_metrics import serve_metrics

            port = serve_metrics(worker.counters, worker.worker_id, args.metrics_port)
            _progress(f"metrics on :{port}/metrics")
        scalars = Scalars(logdir_of(args.logdir, f"collect-{worker.worker_id}"))
        if scalars.logdir is not None:
            _progress(f"TensorBoard event files in {scalars.logdir}")

        def report(counters: Counters) -> None:
            _report(counters)
            scalars.add(counters.env_steps, worker_scalars(counters))

        try:
            worker.run(max_steps=args.steps, report=report, report_every_s=args.progress_every_s)
        finally:
            scalars.close()
            summary = {
                "worker": f"{worker.worker_id}-{worker.run_id}",
                **worker.counters.summary(),
            }
            if worker.reporter is not None:
                worker.reporter.flush()
                summary["episode_reports"] = dataclasses.asdict(worker.reporter.counts)
            _progress("stopped: " + _line(worker.counters))
            print(json.dumps(summary), flush=True)
    return 0


def _report(counters: Counters) -> None:
    _progress(_line(counters))


def worker_scalars(c: Counters) -> dict[str, float | None]:
    """A progress line's numbers as TensorBoard scalars."""
    return {
        "charts/mean_return": c.recent_mean_return,  # the last 100 episodes'
        "charts/episodes": c.episodes,
        "charts/env_steps_per_s": c.steps_per_s,
        "rl/policy_version": max(c.versions, default=None),
        "rl/predict_retries": c.predict_retries,
        "rl/publish_retries": c.publish_retries,
        "rl/unaccepted": c.unaccepted,
    }


def _line(c: Counters) -> str:
    recent = c.recent_mean_return
    mean = "-" if recent is None else f"{recent:.1f}"
    versions = versions_shown(sorted(c.versions))
    return (
        f"{c.env_steps:,} steps ({c.steps_per_s:,.0f}/s), {c.episodes:,} episodes, "
        f"mean return {mean} (last {len(c.recent_returns)}), versions {versions}, "
        f"{c.requests:,} requests, {c.predict_retries} predict and {c.publish_retries} "
        "publish retries" + (f", {c.unaccepted:,} records unaccepted" if c.unaccepted else "")
    )


def versions_shown(versions: list[int], runs: int = 3) -> str:
    """Sorted versions as runs (``1-16``, ``3,5-9``), the last ``runs`` of them: a line that
    stays short however many versions a long run has seen."""
    if not versions:
        return "-"
    spans: list[tuple[int, int]] = []
    for version in versions:
        if spans and version == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], version)
        else:
            spans.append((version, version))
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in spans[-runs:]]
    return ("...," if len(spans) > runs else "") + ",".join(shown)


def _progress(message: str) -> None:
    print(f"rlserve collect: {message}", file=sys.stderr, flush=True)
