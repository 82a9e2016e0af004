"""PPO through an rlserve server, co-located: rollout and training take turns.

The co-located layout (docs/rl-loop.md, "Co-located mode"; ``loop/colocated.py``): one
node, one process tree. This process runs the rollout workers in-process on a ``memory://``
buffer and the trainer, and alternates: collect exactly one batch with the version the
server serves, then hold the model, learn, export and push the next version, resume. Every
record trained on was made by the trainer's current version (staleness 0, asserted on
every batch). With ``--serve-repository`` the server is this process's child
(``loop/child_server.py``): started before the first turn, stopped (SIGTERM: it drains;
SIGKILL after 30 s) when this process ends, whether it finished, failed, or got Ctrl-C or
SIGTERM; if it exits before, this process stops with an error naming its log. The workers
ask for actions over the server's local lane (shared memory, docs/lane.md): a child server
is started with one in this run's private temporary folder, a separate server's is the
configuration's ``inference_cluster.lane``; ``--predictions http`` asks over HTTP. Each
update's log line says which, with the seconds spent in inference and training turns so far.

    # 0. a fresh policy as version 1 and the trainer's checkpoint (the decoupled trainer's step)
    python examples/ppo_trainer.py --init-repository models --model cartpole \\
        --checkpoint runs/cartpole/agent.pt --seed 1
    # 1. everything else, one command: the server (a child, on a free port; its output in
    #    runs/cartpole/server.log), the rollout workers and the trainer, taking turns
    python examples/ppo_trainer.py --config configs/rl_config.yaml --serve-repository models \\
        --model cartpole --checkpoint runs/cartpole/agent.pt

    # or, with the server started separately on the same node (the runner needs its token):
    export RLSERVE_ADMIN_TOKEN=$(openssl rand -hex 16)
    rlserve serve --model-repository models --port 8000 &
    python examples/ppo_colocated.py --config configs/rl_config.yaml \\
        --server http://127.0.0.1:8000 --model cartpole --checkpoint runs/cartpole/agent.pt

``python examples/ppo_trainer.py --config FILE`` with ``cluster_mode: co-located`` in FILE
runs this script with the same arguments. From the loop configuration it takes
``task_schedule`` (the turns' quanta), ``gpu_allocation`` (``CUDA_VISIBLE_DEVICES``: the
``training`` GPUs for this process, set before torch touches CUDA, the ``inference`` GPUs
for the child server; a role without GPUs inherits the node's), ``inference_cluster``
(the server, unless ``--serve-repository``), ``rollout`` (env id; ``num_envs`` per worker)
and ``trainer:`` (this program's flags); the buffer is always in-process (``memory://``)
and the staleness bound is 0 by construction, so ``--buffer``, ``--max-staleness``,
``--fallback`` and the consumer flags of the decoupled trainer are ignored here. The PPO
update, the advantages and the export are the decoupled trainer's
(``examples/ppo_trainer.py``), imported from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ppo_trainer
from ppo_trainer import Agent, Trajectories, export, log_prob_error, ppo_update

from cli.arguments import add_arguments, arg, from_namespace
from client import PolicyClient
from kernel.errors import ConfigError
from loop import config as loop_config
from loop.buffers import open_consumer
from loop.child_server import ChildServer, ChildServerFailed
from loop.collect import RolloutWorker
from loop.colocated import ColocatedRunner, Cycle, ServerCheck, no_check
from loop.controller import Batch, Fallback, LoopMetrics, SyncController
from loop.run_outcome import RunOutcome
from loop.scalars import ROOT, Scalars, logdir_of


class Predictions(enum.Enum):
    """How the in-process rollout workers ask the server for actions."""

    LANE = "lane"  # the server's local lane (shared memory), HTTP when it is not there
    HTTP = "http"


@dataclass
class Args(ppo_trainer.Args):
    workers: int = field(default=2, metadata=arg("in-process rollout workers"))
    num_envs: int = field(default=16, metadata=arg("envs per worker (one request each)"))
    inference_interval: float = field(
        default=0.010, metadata=arg("seconds: the inference turn's quantum (task_schedule)")
    )
    training_interval: float = field(
        default=0.050, metadata=arg("seconds: the training turn's quantum (task_schedule)")
    )
    max_hold_s: float = field(
        default=60.0, metadata=arg("the hold's safety bound: the server resumes by itself")
    )
    serve_repository: Path | None = field(
        default=None,
        metadata=arg(
            "start `rlserve serve` on this model repository as a child process (on 127.0.0.1,"
            " --serve-port) and stop it at the end; --server is then its URL: do not give it"
        ),
    )
    serve_port: int | None = field(
        default=None, metadata=arg("the child server's port (default: a free one)")
    )
    serve_log: Path | None = field(
        default=None,
        metadata=arg("the child server's output (default: server.log beside the checkpoint)"),
    )
    predictions: Predictions = field(
        default=Predictions.LANE,
        metadata=arg(
            "how the workers ask for actions: lane (a child server gets a local lane in a "
            "private temporary folder; a separate server's is the config's "
            "inference_cluster.lane, else HTTP) or http"
        ),
    )


# The exporter exports "__main__:agent": this script's live agent (set in main()).
agent: Agent


class PPOLearner:
    """The decoupled trainer's update as a co-located learner (``loop.colocated.Learner``):
    advantages from the batch, the log-prob check, CleanRL's update, the export."""

    def __init__(self, model: Agent, args: Args, checkpoint: Path, scratch: Path) -> None:
        self.agent, self.args, self.checkpoint, self.scratch = model, args, checkpoint, scratch
        self.optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate, eps=1e-5)
        self.trajectories = Trajectories(args.gamma, args.gae_lambda)
        self.last: dict[str, Any] = {}
        self._path: Path | None = None

    def update(self, batch: Batch, next_version: int) -> Path:
        if self._path is not None:  # the previous version's file: pushed, copied by the server
            shutil.rmtree(self._path.parent, ignore_errors=True)
        started = time.monotonic()
        # bound 0: the last step of an episode left unfinished by the previous batch (its
        # successor's value arrived only now) is of the previous version: not trained on.
        rollout = self.trajectories.add(batch.steps, batch.version, bound=0)
        if len(rollout) and int(rollout.staleness.max()) != 0:
            raise AssertionError(f"trained rows of staleness {rollout.staleness.max()}")
        error = log_prob_error({batch.version: self.agent}, rollout)
        if error is not None and error > 1e-4:
            sys.exit(f"records carry log-probs {error:.2g} away from the trainer's: the server "
                     "does not serve the trainer's weights")  # fmt: skip
        stats = ppo_update(self.agent, self.optimizer, rollout, self.args) if len(rollout) else {}
        exporting = time.monotonic()
        self.agent.eval()
        self._path = export(next_version, self.scratch, self.args)
        self.agent.train()
        torch.save({"version": next_version, "agent": self.agent.state_dict(),
                    "optimizer": self.optimizer.state_dict()}, self.checkpoint)  # fmt: skip
        versions = [s.model_version for s in batch.steps]
        self.last = {
            "trained": len(rollout),
            "batch_version": batch.version,
            "record_versions": [min(versions), max(versions)],
            "trained_staleness_max": int(rollout.staleness.max()) if len(rollout) else 0,
            "log_prob_error": error,
            "ppo_s": round(exporting - started, 3),
            "export_s": round(time.monotonic() - exporting, 3),
            **{k: round(v, 5) for k, v in stats.items()},
        }
        return self._path


def parse(argv: list[str] | None) -> tuple[Args, loop_config.LoopConfig | None]:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0],
        epilog="examples:\n\n" + doc[doc.index("    # 0.") : doc.index("``python examples")],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser, Args)
    default_server = parser.get_default("server")
    parser.set_defaults(server=None)  # to tell whether --server was given
    given = parser.parse_args(argv)
    parser.set_defaults(server=default_server)
    config = None
    if given.config:  # the config's values become the defaults: flags still win
        try:
            config = loop_config.load(*given.config)
            if config.cluster_mode != "co-located":
                parser.error(f"{given.config}: cluster_mode is {config.cluster_mode}; this "
                             "is the co-located trainer (decoupled: ppo_trainer.py)")  # fmt: skip
            defaults = ppo_trainer.config_defaults(config)
            defaults["inference_interval"] = config.task_schedule.inference_interval
            defaults["training_interval"] = config.task_schedule.training_interval
            if "num_envs" in config.rollout.model_fields_set:  # else this program's default
                defaults["num_envs"] = config.rollout.num_envs
            defaults.update(config.trainer)
            parser.set_defaults(**defaults)
        except ConfigError as e:
            parser.error(str(e))
    args = from_namespace(Args, parser.parse_args(argv))
    if args.serve_repository is not None and given.server is not None:
        parser.error(f"--server {given.server} and --serve-repository "
                     f"{args.serve_repository}: give one (--serve-repository starts the "
                     "server and derives its URL)")  # fmt: skip
    if args.serve_repository is None and (args.serve_port, args.serve_log) != (None, None):
        parser.error("--serve-port and --serve-log are for the child server: give "
                     "--serve-repository DIR too")  # fmt: skip
    return args, config


def use_training_devices(config: loop_config.LoopConfig | None) -> None:
    """``CUDA_VISIBLE_DEVICES`` for this process: ``gpu_allocation.training``, when the
    configuration gives it GPUs (before torch initialises CUDA, which reads it then)."""
    gpus = config.cuda_visible_devices("training") if config is not None else ""
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus


def start_server(
    args: Args,
    config: loop_config.LoopConfig | None,
    token: str,
    environ: dict[str, str],
    lane: Path | None,
) -> ChildServer:
    """The child server on ``--serve-repository`` (not started yet: enter it)."""
    assert args.serve_repository is not None
    checkpoint = args.checkpoint or Path("runs") / args.model / "agent.pt"
    return ChildServer(
        args.serve_repository,
        log=args.serve_log or checkpoint.parent / "server.log",
        admin_token=token,
        port=args.serve_port,
        cuda_visible_devices=config.cuda_visible_devices("inference") if config else "",
        environ=environ,
        lane=lane,
    )


def lane_of(args: Args, config: loop_config.LoopConfig | None, scratch: Path) -> Path | None:
    """The local lane the workers use: a child server's, in this run's private scratch
    folder; a separate server's from the configuration; none over HTTP."""
    if args.predictions is Predictions.HTTP:
        return None
    if args.serve_repository is not None:
        return scratch / "rlserve.lane"
    return config.inference_cluster.lane if config is not None else None


def main(argv: list[str] | None = None) -> int:
    args, config = parse(argv)
    node_environment = dict(os.environ)  # the child server's, before this process's GPUs
    use_training_devices(config)
    try:
        return train(args, config, node_environment)
    except ChildServerFailed as error:
        progress(f"error: {error.message}")
        return 1
    except ConfigError as error:  # e.g. --serve-port taken
        progress(f"error: {error.message}")
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the child server (if any) was stopped on the way out
        progress("interrupted")
        return 130


def train(  # noqa: C901 (CleanRL style: the training loop reads top to bottom, in one place)
    args: Args, config: loop_config.LoopConfig | None, environ: dict[str, str]
) -> int:
    global agent
    checkpoint = args.checkpoint or Path("runs") / args.model / "agent.pt"
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)
    spaces = gym.make(args.env)
    shape, action_space = spaces.observation_space.shape or (), spaces.action_space
    if len(shape) != 1 or not isinstance(action_space, gym.spaces.Discrete):
        sys.exit(f"--env {args.env}: this trainer takes vector observations, Discrete actions")
    agent = Agent(shape[0], int(action_space.n))
    if not checkpoint.is_file():
        sys.exit(f"no checkpoint at {checkpoint}: run examples/ppo_trainer.py "
                 "--init-repository DIR first and serve DIR, or give --checkpoint")  # fmt: skip
    saved = torch.load(checkpoint, weights_only=True)
    agent.load_state_dict(saved["agent"])
    version = int(saved["version"])
    token = os.environ.get(args.admin_token_env)
    if not token and config is not None and config.admin_token is not None:
        token = config.admin_token.get_secret_value()
    if not token and args.serve_repository is not None:
        token = secrets.token_hex(16)  # the server is this run's child: a token of its own
    if not token:
        sys.exit(f"{Path(sys.argv[0]).name}: ${args.admin_token_env} is not set: the runner "
                 "holds, pushes and resumes versions on the server at --server, so it needs "
                 f"that server's admin token: export {args.admin_token_env}=<the token it was "
                 "started with> (or give --serve-repository DIR: the runner then starts its "
                 "own server, with a token it makes)")  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="ppo-colocated-"))  # 0700: the lane's too
    lane = lane_of(args, config, scratch)
    learner = PPOLearner(agent, args, checkpoint, scratch)
    if "optimizer" in saved:
        learner.optimizer.load_state_dict(saved["optimizer"])
    # The in-process buffer; the config's co-located default is memory:// too.
    buffer = config.consumer_buffer_url() if config is not None else "memory://rl_experience"
    if not buffer.startswith("memory://"):
        sys.exit(f"co-located: the buffer is in-process (memory://), not {buffer}")
    metrics = LoopMetrics()
    if args.metrics_port is not None:
        metrics.serve_metrics(args.metrics_port)
    log: TextIO | None = args.log_json.open("a") if args.log_json else None
    status, summary = 1, {}
    with ExitStack() as stack:
        check_server: ServerCheck = no_check
        server_url, child = args.server, None
        if args.serve_repository is not None:  # the child: stopped last, when the stack unwinds
            child = stack.enter_context(start_server(args, config, token, environ, lane))
            server_url, check_server = child.url, child.check
            progress(f"started rlserve serve on {args.serve_repository} as pid {child.pid} at "
                     f"{child.url}; its output goes to {child.log}")  # fmt: skip
        client = stack.enter_context(PolicyClient(server_url, admin_token=token, timeout_s=60.0))
        active = client.model(args.model)["active_version"]
        if active != version:
            sys.exit(f"{server_url} serves {args.model} version {active}, {checkpoint} holds "
                     f"version {version}")  # fmt: skip
        workers = [
            stack.enter_context(
                RolloutWorker(
                    args.env,
                    server_url,
                    buffer,
                    num_envs=args.num_envs,
                    seed=1000 * args.seed + w,
                    model=args.model,
                    worker_id=f"w{w}",
                    lane=lane,
                )
            )
            for w in range(args.workers)
        ]

        def stop_workers() -> None:  # else they would retry a vanished server for 60 s
            for worker in workers:
                worker.stop()

        if child is not None:
            child.on_exit(stop_workers)
        consumer = open_consumer(buffer, "trainer", "trainer-0")
        stack.callback(consumer.close)
        controller = SyncController(
            consumer, max_staleness=None, fallback=Fallback.DROP,
            metrics=metrics, version=version,
        )  # fmt: skip
        runner = ColocatedRunner(
            client, args.model, workers, controller, version=version,
            batch_size=args.batch_size, inference_interval=args.inference_interval,
            training_interval=args.training_interval, max_hold_s=args.max_hold_s,
            check_server=check_server,
        )  # fmt: skip
        through = f"the lane {lane}" if lane is not None else "HTTP"
        progress(f"version {version} of {args.model} at {server_url}; {args.workers} x "
                 f"{args.num_envs} envs in-process, predictions over {through}; turns of "
                 f"{args.inference_interval:g} s / {args.training_interval:g} s")  # fmt: skip
        started = last_progress = time.monotonic()
        env_steps, training_s, inference_s, worst_error = 0, 0.0, 0.0, 0.0
        outcome = RunOutcome(
            args.model, "mean return (last 100 episodes)", args.serve_repository, server_url
        )
        scalars = stack.enter_context(Scalars(logdir_of(args.logdir, f"{args.model}-ppo")))
        if scalars.logdir is not None:
            progress(f"TensorBoard event files in {scalars.logdir}: tensorboard --logdir {ROOT}")
        while True:
            cycle: Cycle = runner.cycle(learner)
            env_steps += cycle.inference.records
            training_s += cycle.training.work_s
            inference_s += cycle.inference.seconds
            now = time.monotonic()
            busy = training_s / (now - started)
            metrics.busy(min(1.0, busy))
            worst_error = max(worst_error, learner.last.get("log_prob_error") or 0.0)
            mean_return = learner.trajectories.mean_return
            outcome.published(cycle.version, mean_return)
            summary = {
                "version": cycle.version,
                "env_steps": env_steps,
                "mean_return": mean_return,
                "episodes": learner.trajectories.episodes,
                **learner.last,
                "phases": [cycle.inference.to_json(), cycle.training.to_json()],
                "busy_ratio": round(busy, 3),
                "inference_s": round(inference_s, 2),
                "training_s": round(training_s, 2),
                "predictions": "lane" if lane is not None else "http",
                "wall_s": round(now - started, 2),
            }
            if log is not None:
                log.write(json.dumps(summary) + "\n")
                log.flush()
            scalars.add(env_steps, {
                **ppo_trainer.ppo_scalars(summary),
                "update/inference_turn_s": cycle.inference.seconds,
                "update/training_turn_s": cycle.training.seconds,
            })  # fmt: skip
            returns = learner.trajectories.returns
            reached = len(returns) == 100 and (mean_return or 0) >= args.target_return
            if now - last_progress >= args.progress_every_s or reached:
                last_progress = now
                shown = "-" if mean_return is None else f"{mean_return:.1f}"
                progress(f"{env_steps:,} env steps | mean return {shown} (last {len(returns)})"
                         f" | version {cycle.version} | training {busy:.0%} of the time | "
                         f"{now - started:.0f} s")  # fmt: skip
            if reached:
                status = 0
                progress(f"reached a mean return of {mean_return:.1f} >= {args.target_return:g}")
                break
            if env_steps >= args.max_env_steps:
                progress(f"--max-env-steps {args.max_env_steps:,} taken, below the target return")
                break
        summary.pop("phases", None)
        summary.update(
            reached=status == 0,
            staleness_max=0,
            log_prob_error_max=worst_error,
            cycles=len(runner.phases) // 2,
            accounting=dataclasses.asdict(controller.accounting()),
        )
        for line in outcome.lines(cycle.version):
            progress(line)
    shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(summary), flush=True)
    return status


def progress(message: str) -> None:
    print(f"ppo_colocated: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
