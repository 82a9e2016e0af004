"""GRPO through an rlserve server, co-located: sampling and training take turns.

The co-located layout of ``loop/colocated.py`` (docs/rl-loop.md, "GRPO"), for a language
model: one process runs a prompt worker (``loop.grpo.worker.PromptWorker``) on a
``memory://`` buffer and the trainer (``examples/grpo_trainer.py``); the server is its
child. Each cycle samples one batch of groups with the version the server serves, then
holds the model, takes the GRPO steps, exports the next version (parity gate included)
into the repository's hidden ``.grpo`` folder, pushes it by path, and resumes. Every
completion trained on was sampled by the trainer's current version (staleness 0, asserted
on every batch), and its recorded log-probs are checked against the trainer's.

    python examples/lm/tiny_policy.py runs/tiny              # tiny policies (half a minute)
    python examples/grpo_colocated.py --policy runs/tiny/llama-base \\
        --serve-repository runs/grpo/models --model assistant

With no ``--prompts`` the toy task is used (``examples/grpo_task.py``: answer about the
noun asked about, rewarded by ``grpo_task:answers_about_the_noun``). The run stops once
the mean reward of the last ``--window`` batches reaches ``--target-reward`` (exit 0), or
after ``--max-cycles`` (exit 1), and prints a summary as one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import statistics
import sys
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_task
from grpo_trainer import Hyper, config_defaults, grpo_scalars, progress, start

from client import PolicyClient
from loop.buffers import memory, open_consumer
from loop.child_server import ChildServer
from loop.colocated import ColocatedRunner
from loop.controller import Fallback, SyncController
from loop.experience import Completion
from loop.grpo import prompts, rewards
from loop.grpo.worker import PromptWorker, Sampling
from loop.run_outcome import RunOutcome
from loop.scalars import ROOT, Scalars, logdir_of


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True, help="a causal LM folder (TRL's)")
    parser.add_argument(
        "--serve-repository", type=Path, required=True,
        help="the model repository the run's own server serves; every version lands here",
    )  # fmt: skip
    parser.add_argument("--model", default="assistant", help="the served model's name")
    parser.add_argument("--prompts", type=Path, help="JSONL prompts (default: the toy task's)")
    parser.add_argument(
        "--reward", default="grpo_task:answers_about_the_noun",
        help="module:function scoring (completion_text, row) (default: the toy task's)",
    )  # fmt: skip
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--groups", type=int, default=32, help="groups sampled per batch")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="tokens per completion")
    parser.add_argument("--learning-rate", type=float, default=Hyper.learning_rate)
    parser.add_argument(
        "--updates-per-batch", type=int, default=Hyper.updates_per_batch,
        help="optimizer steps on each batch",
    )  # fmt: skip
    parser.add_argument(
        "--target-reward", type=float, default=0.8,
        help="stop (exit 0) once the mean reward of the last --window batches reaches it",
    )  # fmt: skip
    parser.add_argument("--window", type=int, default=3, help="batches the target is over")
    parser.add_argument(
        "--max-cycles", type=int, default=150,
        help="stop (exit 1) after this many cycles (one batch and one version each); the "
        "toy task as written reaches 0.8 in about 80 (80 s on 2 cores); --max-cycles 3 "
        "--groups 4 --group-size 4 is a smoke run of about 10 s",
    )  # fmt: skip
    parser.add_argument("--lora-rank", type=int, help="train a LoRA adapter (default: full)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--inference-interval", type=float, default=0.01, help="seconds")
    parser.add_argument("--training-interval", type=float, default=0.05, help="seconds")
    parser.add_argument("--log-json", type=Path, help="one line per cycle")
    parser.add_argument(
        "--logdir",
        help="TensorBoard event files here: tensorboard --logdir runs (default: "
        "runs/<model>-grpo-<date>-<time>; none: no event files)",
    )
    parser.add_argument(
        "--config", nargs="+", default=[], metavar="FILE",
        help="the loop's configuration (rl_config.yaml): task_schedule, gpu_allocation and "
        "trainer: become the flags' defaults",
    )  # fmt: skip
    config = config_defaults(parser.parse_args(argv).config, parser)
    if config is not None and config.cluster_mode != "co-located":
        parser.error(f"cluster_mode {config.cluster_mode}: run examples/grpo_decoupled.py")
    args = parser.parse_args(argv)
    args.loop_config = config
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    config = args.loop_config
    if config is not None and config.cuda_visible_devices("training"):  # before torch's CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = config.cuda_visible_devices("training")
    repository = args.serve_repository
    learner = start(args)
    version = 1
    prompt_file = args.prompts or grpo_task.write(repository.parent / TOY_PROMPTS)
    rows = prompts.Prompts(prompts.read(prompt_file))
    reward = rewards.load(args.reward)
    token = os.environ.get("RLSERVE_ADMIN_TOKEN") or secrets.token_hex(16)
    buffer = f"memory://grpo-{secrets.token_hex(4)}"
    sampling = Sampling(args.group_size, args.max_new_tokens, groups=args.groups)
    recent: deque[float] = deque(maxlen=args.window)
    summary: dict[str, Any] = {}
    status = 1
    with ExitStack() as stack:
        server = stack.enter_context(
            ChildServer(
                repository, log=repository.parent / "server.log", admin_token=token,
                cuda_visible_devices=config.cuda_visible_devices("inference") if config else "",
            )
        )  # fmt: skip
        progress(f"serving {repository} at {server.url} (log: {server.log})")
        client = stack.enter_context(PolicyClient(server.url, admin_token=token, timeout_s=120))
        worker = stack.enter_context(
            PromptWorker(server.url, args.model, buffer, rows, reward, sampling=sampling,
                         seed=args.seed, worker_id="w0")
        )  # fmt: skip
        server.on_exit(worker.stop)
        consumer = open_consumer(buffer, "trainer", "trainer-0")
        stack.callback(consumer.close)
        stack.callback(memory.discard, buffer)
        controller = SyncController[Completion](
            consumer, max_staleness=None, fallback=Fallback.DROP, version=version,
            records=Completion,
        )  # fmt: skip
        runner = ColocatedRunner(
            client, args.model, [worker], controller, version=version,
            batch_size=args.groups * args.group_size,
            inference_interval=args.inference_interval,
            training_interval=args.training_interval, max_hold_s=300, repository=repository,
            check_server=server.check,
        )  # fmt: skip
        log = args.log_json.open("a") if args.log_json else None
        started = time.monotonic()
        measured: list[dict[str, Any]] = []
        outcome = RunOutcome(
            args.model, f"mean reward (last {args.window} cycles)", repository, server.url
        )
        scalars = stack.enter_context(Scalars(logdir_of(args.logdir, f"{args.model}-grpo")))
        if scalars.logdir is not None:
            progress(f"TensorBoard event files in {scalars.logdir}: tensorboard --logdir {ROOT}")
        for _ in range(args.max_cycles):
            cycle = runner.cycle(learner)
            recent.append(learner.last["mean_reward"])
            outcome.published(cycle.version, sum(recent) / len(recent))
            assert cycle.training.update is not None
            update = cycle.training.update.to_json()
            summary = {
                "version": cycle.version,
                "mean_reward": learner.last["mean_reward"],
                "window_reward": sum(recent) / len(recent),
                **learner.last,
                **update,
                # from the optimizer's last step to the new version serving
                "update_latency_s": round(
                    learner.last["export_s"] + update["update_push_s"] + update["update_resume_s"],
                    4,
                ),
                "sample_s": round(cycle.inference.work_s, 3),
                "sampled_tokens": worker.counters.tokens,
                "train_s": round(cycle.training.work_s, 3),
                "inference_turn_s": round(cycle.inference.seconds, 4),
                "training_turn_s": round(cycle.training.seconds, 4),
                "wall_s": round(time.monotonic() - started, 2),
            }
            measured.append(summary)
            if log is not None:
                log.write(json.dumps(summary) + "\n")
                log.flush()
            scalars.add(cycle.version, grpo_scalars(summary))
            progress(
                f"version {cycle.version}: mean reward {summary['mean_reward']:.2f} (last "
                f"{len(recent)}: {summary['window_reward']:.2f}), log-prob error "
                f"{summary['log_prob_error']:.1e}, {summary['wall_s']:.0f} s"
            )
            if len(recent) == args.window and summary["window_reward"] >= args.target_reward:
                status = 0
                break
        summary.update(
            reached=status == 0,
            cycles=len(runner.phases) // 2,
            staleness_max=0,
            log_prob_error_max=max(c["log_prob_error"] or 0.0 for c in measured),
            accounting=dataclasses.asdict(controller.accounting()),
            totals=totals(measured),
        )
        if log is not None:
            log.close()
        for line in outcome.lines(summary.get("version", version)):
            progress(line)
    print(json.dumps(summary), flush=True)
    return status


TOY_PROMPTS = "toy_prompts.jsonl"  # beside the repository


def totals(cycles: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's rates and shares, and the median weight update with its parts."""
    wall = cycles[-1]["wall_s"]
    sampling = sum(c["inference_turn_s"] for c in cycles)
    training = sum(c["training_turn_s"] for c in cycles)

    def median(key: str) -> float:
        return round(statistics.median(c[key] for c in cycles), 4)

    return {
        "rollout_tokens_per_s": round(
            cycles[-1]["sampled_tokens"] / sum(c["sample_s"] for c in cycles)
        ),
        "trainer_samples_per_s": round(
            sum(c["completions"] for c in cycles) / sum(c["learn_s"] for c in cycles)
        ),
        "sampler_waiting_share": round(training / wall, 3),  # the model held: training
        "trainer_waiting_share": round(sampling / wall, 3),  # sampling the next batch
        "update_share": round(sum(c["update_latency_s"] for c in cycles) / wall, 3),
        "update_latency_median_s": median("update_latency_s"),
        **{
            f"{k}_median_s": median(k)
            for k in (
                "export_s",
                "update_push_s",
                "update_load_s",
                "update_swap_s",
                "update_resume_s",
                "learn_s",
            )
        },
    }


if __name__ == "__main__":
    sys.exit(main())
