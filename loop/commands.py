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
import json
import sys
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from serve.cli.arguments import add_arguments as add_dataclass_arguments
from serve.cli.arguments import arg, from_namespace

if TYPE_CHECKING:
    from loop.collect import Counters, Vectorization

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
    "Several workers may feed one buffer. SIGTERM or SIGINT stops after the current "
    "iteration. (`rlserve rollout` is something else: blue-green releases on Kubernetes.)"
)
_EXAMPLE = (
    "examples:\n"
    "  rlserve collect --env CartPole-v1 --server http://127.0.0.1:8000 \\\n"
    "      --buffer file:///tmp/experience --num-envs 8 --seed 0 --steps 100000\n"
    "  rlserve collect --env CartPole-v1 --server http://rlserve:8000 --model cartpole \\\n"
    "      --buffer 'redis://redis:6379/0?stream=rl_experience' --num-envs 64"
)


@dataclass(kw_only=True)
class CollectArgs:
    env: str = field(metadata=arg("gymnasium environment id, e.g. CartPole-v1", metavar="ENV_ID"))
    server: str = field(
        metadata=arg(
            "the rlserve server to ask for actions, e.g. http://127.0.0.1:8000", metavar="URL"
        )
    )
    buffer: str = field(
        metadata=arg(
            "experience buffer to publish to: memory://NAME (in-process; only useful from "
            "Python), file:///DIR (a local log for a trainer on this machine), "
            "redis://HOST:PORT/DB?stream=NAME, kafka://HOST:PORT/TOPIC?partitions=N",
            metavar="URL",
        )
    )
    num_envs: int = field(
        default=8,
        metadata=arg("environments stepped together, all asked for in one request", metavar="N"),
    )
    seed: int | None = field(
        default=None,
        metadata=arg(
            "seeds the envs' resets and the server's action sampling (a seed per request, "
            "drawn from it), for a reproducible run; give each worker its own (default: "
            "fresh randomness, and requests without a seed, which the server serves faster)",
            metavar="N",
        ),
    )
    model: str | None = field(
        default=None,
        metadata=arg("model to ask (default: the server's default model)", metavar="NAME"),
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
    retry_for_s: float = field(
        default=60.0,
        metadata=arg(
            "how long to keep retrying a failing server (connection refused, 429, 503, 504) "
            "or a full or unreachable buffer before giving up",
            metavar="SECONDS",
        ),
    )
    vectorization: str = field(
        default="auto",
        metadata=arg(
            "auto: the env's own vectorised implementation when it has one (fast), else "
            "sync; sync: all envs in this process; async: one subprocess per env (for "
            "expensive envs)",
            choices=["auto", "sync", "async"],
        ),
    )
    progress_every_s: float = field(
        default=5.0, metadata=arg("seconds between progress lines on stderr", metavar="SECONDS")
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = textwrap.fill(_DESCRIPTION, width=78)
    parser.epilog = _EXAMPLE
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_dataclass_arguments(parser, CollectArgs)


def run(namespace: argparse.Namespace) -> int:
    from loop.collect import RolloutWorker

    args = from_namespace(CollectArgs, namespace)
    with RolloutWorker(
        args.env,
        args.server,
        args.buffer,
        num_envs=args.num_envs,
        seed=args.seed,
        model=args.model,
        worker_id=args.worker_id,
        retry_for_s=args.retry_for_s,
        vectorization=cast("Vectorization", args.vectorization),  # argparse checked it
    ) as worker:
        _progress(
            f"worker {worker.worker_id}-{worker.run_id}: {args.num_envs} x {args.env} "
            f"-> {args.buffer}, asking {args.server}"
        )
        try:
            worker.run(max_steps=args.steps, report=_report, report_every_s=args.progress_every_s)
        finally:
            summary = {
                "worker": f"{worker.worker_id}-{worker.run_id}",
                **worker.counters.summary(),
            }
            _progress("stopped: " + _line(worker.counters))
            print(json.dumps(summary), flush=True)
    return 0


def _report(counters: Counters) -> None:
    _progress(_line(counters))


def _line(c: Counters) -> str:
    recent = c.recent_mean_return
    mean = "-" if recent is None else f"{recent:.1f}"
    versions = ",".join(map(str, sorted(c.versions))) or "-"
    return (
        f"{c.env_steps:,} steps ({c.steps_per_s:,.0f}/s), {c.episodes:,} episodes, "
        f"mean return {mean} (last {len(c.recent_returns)}), versions {versions}, "
        f"{c.requests:,} requests, {c.predict_retries} predict and {c.publish_retries} "
        "publish retries"
    )


def _progress(message: str) -> None:
    print(f"rlserve collect: {message}", file=sys.stderr, flush=True)
