"""GRPO through an rlserve server, decoupled: workers keep sampling while the trainer trains.

The decoupled layout of docs/rl-loop.md for a language model. Prompt workers
(``loop.grpo.worker.PromptWorker``) sample groups from whatever version the server serves
and publish them to a buffer; the trainer (``examples/grpo_trainer.py``) takes batches from
it through the staleness controller (``--max-staleness``, ``--fallback``), learns, exports
and pushes each new version by path, never holding the model: sampling and learning
overlap, and a batch may hold groups of older versions, whose ratio against the recorded
behaviour log-probs the clipped objective corrects. The log-prob check covers the groups
of the trainer's own version.

    python examples/grpo_decoupled.py --policy runs/tiny/llama-base \\
        --serve-repository runs/grpo/models --model assistant --workers 2

``--role all`` (the default) runs the server as a child, ``--workers`` worker threads and
the trainer in this process, over ``--buffer`` (``memory://`` by default; ``file://`` or
``redis://`` too). ``--role worker`` runs one worker process against ``--server`` and
``--buffer`` until stopped (SIGTERM, Ctrl-C), so workers can run anywhere; ``--role
trainer`` runs the trainer alone against them. The trainer stops once the mean reward of
the last ``--window`` batches reaches ``--target-reward`` (exit 0) or after
``--max-versions`` (exit 1), and prints a summary as one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_task
from grpo_colocated import TOY_PROMPTS
from grpo_trainer import GRPOLearner, Hyper, config_defaults, grpo_scalars, progress, start

from client import PolicyClient
from loop.buffers import memory, open_consumer, open_producer
from loop.buffers.base import BufferOptions, Producer
from loop.child_server import ChildServer
from loop.controller import Fallback, SyncController
from loop.experience import Completion
from loop.grpo import prompts, rewards
from loop.grpo.worker import PromptWorker, Sampling
from loop.run_outcome import RunOutcome
from loop.scalars import ROOT, Scalars, logdir_of


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("all", "worker", "trainer"), default="all")
    parser.add_argument("--policy", type=Path, help="a causal LM folder (TRL's): the trainer's")
    parser.add_argument("--serve-repository", type=Path, help="the served model repository")
    parser.add_argument("--server", help="a running server (roles worker and trainer)")
    parser.add_argument("--model", default="assistant")
    parser.add_argument("--buffer", help="the experience buffer (default: memory://, role all)")
    parser.add_argument("--prompts", type=Path, help="JSONL prompts (default: the toy task's)")
    parser.add_argument("--reward", default="grpo_task:answers_about_the_noun")
    parser.add_argument("--workers", type=int, default=2, help="worker threads (role all)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups", type=int, default=8, help="groups a worker samples a step")
    parser.add_argument("--batch-groups", type=int, default=32, help="groups a batch holds")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--fallback", choices=[f.value for f in Fallback], default="drop")
    parser.add_argument("--learning-rate", type=float, default=Hyper.learning_rate)
    # Fewer steps per batch than co-located (4): half a batch is a version old, and more
    # steps on it overshoot (measured: 4 plateaued near 0.55, 2 reached 0.8).
    parser.add_argument("--updates-per-batch", type=int, default=2)
    parser.add_argument("--target-reward", type=float, default=0.8)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--max-versions", type=int, default=200)
    parser.add_argument("--lora-rank", type=int, help="train a LoRA adapter (default: full)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--log-json", type=Path, help="one line per version")
    parser.add_argument(
        "--logdir",
        help="TensorBoard event files here: tensorboard --logdir runs (default: "
        "runs/<model>-grpo-<date>-<time>; none: no event files)",
    )
    parser.add_argument("--offline-buffer", help="where --fallback offline sends stale groups")
    parser.add_argument(
        "--config", nargs="+", default=[], metavar="FILE",
        help="the loop's configuration (decoupled_config.yaml, sync_policy.yaml): the server, "
        "the buffer, sync_policy and trainer: become the flags' defaults",
    )  # fmt: skip
    config = config_defaults(parser.parse_args(argv).config, parser)
    if config is not None and config.cluster_mode != "decoupled":
        parser.error(f"cluster_mode {config.cluster_mode}: run examples/grpo_colocated.py")
    args = parser.parse_args(argv)
    if args.role != "worker" and (args.policy is None or args.serve_repository is None):
        parser.error(f"--role {args.role} needs --policy and --serve-repository")
    if args.role != "all" and (args.server is None or args.buffer is None):
        parser.error(f"--role {args.role} needs --server and --buffer")
    if args.fallback == Fallback.OFFLINE and args.offline_buffer is None:
        parser.error("--fallback offline needs --offline-buffer (where stale groups go)")
    return args


def make_worker(args: argparse.Namespace, server: str, buffer: str, index: int) -> PromptWorker:
    scratch = Path(tempfile.gettempdir()) / f"grpo-{os.getpid()}-{TOY_PROMPTS}"
    prompt_file = args.prompts or grpo_task.write(scratch)
    rows = prompts.Prompts(prompts.read(prompt_file))
    sampling = Sampling(args.group_size, args.max_new_tokens, groups=args.groups)
    # Workers run ahead of the trainer by one batch at most: the buffer holds no more
    # uncommitted completions (a worker waits for room), so little is sampled to go stale.
    ahead = BufferOptions(max_pending=args.batch_groups * args.group_size, publish_timeout_s=1)
    return PromptWorker(
        server, args.model, buffer, rows, rewards.load(args.reward), sampling=sampling,
        seed=1000 * args.seed + index, worker_id=f"w{index}", buffer_options=ahead,
        retry_for_s=600,
    )  # fmt: skip


def run_worker(args: argparse.Namespace) -> int:
    """One worker process until SIGTERM or Ctrl-C."""
    with make_worker(args, args.server, args.buffer, os.getpid()) as worker:
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        try:
            while worker.step():
                pass
        except KeyboardInterrupt:
            pass
        worker.producer.flush(timeout_s=1.0)
        counters = worker.counters
        if counters.unaccepted:
            progress(f"stopped with {counters.unaccepted} completions the buffer did not take")
        print(json.dumps({"groups": counters.groups, "published": counters.published,
                          "unaccepted": counters.unaccepted}))  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.role == "worker":
        return run_worker(args)
    repository: Path = args.serve_repository
    learner = start(args)
    version = 1
    token = os.environ.get("RLSERVE_ADMIN_TOKEN") or secrets.token_hex(16)
    buffer = args.buffer or f"memory://grpo-{secrets.token_hex(4)}"
    with ExitStack() as stack:
        server = args.server
        if args.role == "all":  # the child's URL, whatever the configuration names
            child = stack.enter_context(
                ChildServer(repository, log=repository.parent / "server.log", admin_token=token)
            )
            server = child.url
            progress(f"serving {repository} at {server} (log: {child.log})")
        client = stack.enter_context(PolicyClient(server, admin_token=token, timeout_s=120))
        consumer = open_consumer(buffer, "trainer", "trainer-0")
        stack.callback(consumer.close)
        if buffer.startswith("memory://"):
            stack.callback(memory.discard, buffer)
        offline = None
        if args.fallback == Fallback.OFFLINE:
            offline = stack.enter_context(_closing(open_producer(args.offline_buffer)))
        controller = SyncController[Completion](
            consumer, max_staleness=args.max_staleness, fallback=Fallback(args.fallback),
            offline=offline, version=version, records=Completion,
        )  # fmt: skip
        workers = start_workers(args, server, buffer, stack) if args.role == "all" else []
        status, summary = train(args, learner, client, controller, version)
        summary.update(sampling(workers, summary["wall_s"]))
    print(json.dumps(summary), flush=True)
    return status


def start_workers(
    args: argparse.Namespace, server: str, buffer: str, stack: ExitStack
) -> list[PromptWorker]:
    """``--workers`` worker threads, stopped (and joined) when ``stack`` unwinds."""
    workers = [
        stack.enter_context(make_worker(args, server, buffer, i)) for i in range(args.workers)
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=_sample, args=(w, stop)) for w in workers]
    for thread in threads:
        thread.start()

    def stop_workers() -> None:
        stop.set()
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(timeout=60)

    stack.callback(stop_workers)
    return workers


def sampling(workers: list[PromptWorker], wall: float) -> dict[str, Any]:
    """The sampling side over the trainer's wall-clock (this process's workers only)."""
    if not workers:
        return {}
    tokens = sum(w.counters.tokens for w in workers)
    blocked = sum(w.counters.publish_s for w in workers) / len(workers)
    return {
        "rollout_tokens_per_s": round(tokens / wall),
        "sampler_waiting_share": round(blocked / wall, 3),  # for the buffer's room
    }


def _sample(worker: PromptWorker, stop: threading.Event) -> None:
    while not stop.is_set() and worker.step():
        pass


def train(
    args: argparse.Namespace,
    learner: GRPOLearner,
    client: PolicyClient,
    controller: SyncController[Completion],
    version: int,
) -> tuple[int, dict[str, Any]]:
    """Batches from the controller, a version pushed after each, until the target."""
    log = args.log_json.open("a") if args.log_json else None
    recent: deque[float] = deque(maxlen=args.window)
    measured: list[dict[str, Any]] = []
    started = time.monotonic()
    waited = 0.0
    status, summary = 1, {}
    size = args.batch_groups * args.group_size
    outcome = RunOutcome(
        args.model, f"mean reward (last {args.window} versions)", args.serve_repository,
        str(args.server),
    )  # fmt: skip
    scalars = Scalars(logdir_of(args.logdir, f"{args.model}-grpo"))
    if scalars.logdir is not None:
        progress(f"TensorBoard event files in {scalars.logdir}: tensorboard --logdir {ROOT}")
    while version - 1 < args.max_versions:
        waiting = time.monotonic()
        batch = controller.next_batch(size, timeout_s=30.0)  # short: the workers fell behind
        waited += time.monotonic() - waiting
        if not batch.steps:
            controller.commit(batch)
            continue
        learning = time.monotonic()
        path = learner.update(batch, version + 1)
        pushing = time.monotonic()
        relative = str(path.resolve().relative_to(args.serve_repository.resolve()))
        digest = _sha256(path)
        pushed = client.push_from_repository(args.model, version + 1, relative, digest)
        pushed_at = time.monotonic()
        version += 1
        controller.set_version(version)
        controller.commit(batch)
        if learner.last["mean_reward"] is not None:
            recent.append(learner.last["mean_reward"])
        outcome.published(version, sum(recent) / len(recent) if recent else None)
        summary = {
            "version": version,
            **learner.last,
            "window_reward": sum(recent) / len(recent) if recent else None,
            "batch_staleness": sorted(set(batch.staleness)),
            "learner_s": round(pushing - learning, 4),
            "push_s": round(pushed_at - pushing, 4),
            "load_s": pushed.get("load_s"),
            # from the optimizer's last step to the new version serving (no hold, no resume)
            "update_latency_s": round(learner.last["export_s"] + pushed_at - pushing, 4),
            "trainer_waiting_s": round(waited, 3),
            "wall_s": round(time.monotonic() - started, 2),
        }
        measured.append(summary)
        if log is not None:
            log.write(json.dumps(summary) + "\n")
            log.flush()
        scalars.add(version, grpo_scalars(summary))
        error = learner.last["log_prob_error"]
        progress(
            f"version {version}: mean reward {learner.last['mean_reward']:.2f} (last "
            f"{len(recent)}: {summary['window_reward']:.2f}), staleness "
            f"{summary['batch_staleness']}, log-prob error "
            + ("-" if error is None else f"{error:.1e}")
        )
        if len(recent) == args.window and summary["window_reward"] >= args.target_reward:
            status = 0
            break
    if log is not None:
        log.close()
    scalars.close()
    wall = time.monotonic() - started
    summary.update(
        reached=status == 0,
        staleness_max=max((max(c["batch_staleness"]) for c in measured), default=0),
        log_prob_error_max=max(
            (c["log_prob_error"] for c in measured if c["log_prob_error"] is not None), default=None
        ),
        checked_groups=sum(c["checked_groups"] for c in measured),
        accounting=dataclasses.asdict(controller.accounting()),
        update_latency_median_s=(
            round(statistics.median(c["update_latency_s"] for c in measured), 4)
            if measured else None
        ),
        trainer_waiting_share=round(waited / wall, 3),
        trainer_samples_per_s=round(
            sum(c["completions"] for c in measured) / max(1e-9, sum(c["learn_s"] for c in measured))
        ),
        update_share=round(sum(c["update_latency_s"] for c in measured) / wall, 3),
        wall_s=round(wall, 2),
    )  # fmt: skip
    for line in outcome.lines(version):
        progress(line)
    return status, summary


@contextlib.contextmanager
def _closing(producer: Producer) -> Iterator[Producer]:
    try:
        yield producer
    finally:
        producer.flush()
        producer.close()


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


if __name__ == "__main__":
    sys.exit(main())
