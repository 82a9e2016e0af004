"""PPO that learns through an rlserve server: the trainer of the decoupled layout.

Four commands, each its own process (docs/rl-loop.md, "Learning through the server"):

    # 0. a fresh policy as version 1 of `cartpole`, and the checkpoint the trainer starts from
    python examples/ppo_trainer.py --init-repository models --model cartpole --seed 1
    openssl rand -hex 16 > runs/admin_token   # the admin token: 16 characters or more
    # 1. the server; the admin token lets the trainer push versions
    RLSERVE_ADMIN_TOKEN=$(cat runs/admin_token) rlserve serve --model-repository models
    # 2. rollout workers (collect.yaml: `data_buffer: {max_pending: 8192}`, back-pressure)
    rlserve collect --config collect.yaml --env CartPole-v1 --model cartpole \\
        --server http://127.0.0.1:8000 --buffer file:///tmp/experience --num-envs 16 --seed 1
    # 3. this trainer
    RLSERVE_ADMIN_TOKEN=$(cat runs/admin_token) python examples/ppo_trainer.py --model cartpole \\
        --server http://127.0.0.1:8000 --buffer file:///tmp/experience --max-staleness 2

With ``--config FILE`` saying ``cluster_mode: co-located`` (the reference ``rl_config.yaml``)
this program runs ``examples/ppo_colocated.py`` instead, with the same arguments: rollout
and training in one process, taking turns on the device (docs/rl-loop.md, "Co-located mode").

One update reads like CleanRL's ppo.py, except that the rollout comes from the buffer and
the new weights go to the server:

    batch = controller.next_batch(N)           # records at most --max-staleness versions old
    rollout = trajectories.add(batch.steps)    # per-episode GAE from the recorded values
    ppo_update(agent, optimizer, rollout)      # ratio against the RECORDED log-probs
    path = export(version + 1)                 # the exporter: ONNX, parity, contract
    client.push(model, version + 1, path)      # the workers' next requests get it
    controller.set_version(version + 1)
    controller.commit(batch)                   # only now: at least once

Plugging in another trainer: the consumer interface is ``next_batch`` / ``set_version`` /
``commit``. A batch is a list of ``loop.experience.Step`` (observation, action, the
behaviour policy's ``log_prob`` and ``value``, reward, terminated, truncated,
``model_version``); ``Trajectories`` below turns it into CleanRL's ``b_*`` arrays.

- CleanRL: keep its ``Agent`` and its update; its rollout loop becomes ``next_batch`` +
  ``Trajectories.add`` (``b_obs``, ``b_actions``, ``b_logprobs``, ``b_advantages``,
  ``b_returns`` are ``Rollout``'s fields); publish with ``export`` below (or ``rlserve export
  torch agent.py:make_agent --checkpoint agent.pt``) and ``PolicyClient.push``.
- Stable-Baselines3: give ``PPO.train()`` a rollout buffer whose ``get(batch_size)`` yields
  ``RolloutBufferSamples`` built from a ``Rollout`` (``old_log_prob``: the recorded
  log-probs, ``old_values``: the recorded values) instead of calling ``collect_rollouts``;
  then ``model.save()`` and publish with ``rlserve export sb3 model.zip``. SB3's update is
  on-policy: keep ``--max-staleness`` small, as here, and let the clipped ratio do the rest.
- TRL (GRPO, PPO for language models): override the step that generates completions
  (``GRPOTrainer._generate_and_score_completions``) to read a batch instead; the recorded
  ``log_prob`` is the sampler's log-probability, which TRL's importance-sampling correction
  takes as the old log-probs (``Step.log_prob`` is one number: record a completion's sum,
  a sequence-level ratio, or one token per record). Its weight sync to the generator
  becomes export + ``PolicyClient.push`` + ``set_version``.

Truncation and unfinished episodes are explained where advantages are computed
(``Trajectories``). Progress goes to stderr, one JSON summary to stdout; exit status 0 once
the mean return of the last 100 episodes in the records reaches ``--target-return``, 1 if
``--max-env-steps`` were taken first.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import runpy
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Categorical

from cli.arguments import add_arguments, arg, from_namespace
from client import PolicyClient
from export import writer
from export.actor_critic.pipeline import ParitySettings, export_policy
from export.modules.source import TorchOptions, load_source
from export.reweight import Reweighable
from kernel.errors import ConfigError
from loop import config as loop_config
from loop.buffers import open_consumer, open_producer
from loop.controller import Fallback, LoopMetrics, SyncController
from loop.experience import Deduplicator, Step
from loop.group_names import group_name_problem
from loop.run_outcome import RunOutcome
from loop.scalars import ROOT, Scalars, logdir_of


@dataclass
class Args:
    config: list[str] | None = field(
        default=None, metadata=arg("the loop's YAML (loop/config.py); flags given here win")
    )
    server: str = field(default="http://127.0.0.1:8000", metadata=arg("the rlserve server"))
    buffer: str = field(default="file:///tmp/experience", metadata=arg("where workers publish"))
    model: str = field(default="cartpole", metadata=arg("the model's name on the server"))
    env: str = field(default="CartPole-v1", metadata=arg("gymnasium id: the policy's spaces"))
    max_staleness: int | None = field(
        default=None, metadata=arg("versions a record may lag behind the trainer (none: no bound)")
    )
    fallback: Fallback = field(default=Fallback.DROP, metadata=arg("for over-stale records"))
    offline_buffer: str | None = field(default=None, metadata=arg("for --fallback offline"))
    target_return: float = field(default=475.0, metadata=arg("stop at this 100-episode mean"))
    max_env_steps: int = field(default=1_000_000, metadata=arg("give up after taking this many"))
    seed: int = field(default=1, metadata=arg("seeds the initial weights and minibatches"))
    admin_token_env: str = field(
        default="RLSERVE_ADMIN_TOKEN", metadata=arg("environment variable with the admin token")
    )
    init_repository: Path | None = field(
        default=None, metadata=arg("write a fresh policy as version 1 into this repository, exit")
    )
    checkpoint: Path | None = field(
        default=None, metadata=arg("weights and version, saved each update (runs/MODEL/agent.pt)")
    )
    group: str = field(default="trainer", metadata=arg("the buffer's consumer group"))
    consumer: str | None = field(default=None, metadata=arg("this consumer's name: GROUP-0"))
    metrics_port: int | None = field(default=None, metadata=arg("serve /metrics on this port"))
    log_json: Path | None = field(default=None, metadata=arg("one JSON line per update"))
    logdir: str | None = field(
        default=None,
        metadata=arg(
            "TensorBoard event files here: tensorboard --logdir runs (default: "
            "runs/<model>-ppo-<date>-<time>; none: no event files)"
        ),
    )
    log_keys: bool = field(default=False, metadata=arg("--log-json lists the steps trained on"))
    progress_every_s: float = field(default=5.0, metadata=arg("seconds between progress lines"))
    idle_timeout_s: float = field(default=60.0, metadata=arg("give up without experience"))
    torch_threads: int = field(default=1, metadata=arg("torch.set_num_threads"))
    parity_samples: int = field(default=64, metadata=arg("observations the exporter checks"))
    # PPO, CleanRL's names and defaults, but 8x its batch (4096 records: 128 steps of each
    # of 32 envs) and 10x its learning rate: few updates, each an export and a push.
    batch_size: int = field(default=4096, metadata=arg("records per update"))
    learning_rate: float = field(default=2.5e-3, metadata=arg("Adam's learning rate"))
    anneal_lr: bool = field(default=False, metadata=arg("to 0 at --max-env-steps"))
    gamma: float = field(default=0.99, metadata=arg("discount"))
    gae_lambda: float = field(default=0.95, metadata=arg("GAE's lambda"))
    num_minibatches: int = field(default=8, metadata=arg("minibatches per epoch"))
    update_epochs: int = field(default=4, metadata=arg("epochs over each batch"))
    clip_coef: float = field(default=0.2, metadata=arg("the surrogate's clipping"))
    ent_coef: float = field(default=0.01, metadata=arg("entropy bonus"))
    vf_coef: float = field(default=0.5, metadata=arg("value loss weight"))
    max_grad_norm: float = field(default=0.5, metadata=arg("gradient clipping"))
    target_kl: float | None = field(default=None, metadata=arg("stop epochs above this KL"))


# The exporter resolves MODULE:ATTR; "__main__:agent" is this script's live agent, so each
# update is exported exactly as `rlserve export torch` exports a module.
EXPORT_TARGET = "__main__:agent"
CHECKED_VERSIONS = 4  # versions whose weights are kept to check their records' log-probs


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    """CleanRL's discrete actor-critic. ``get_dist_and_value`` is what the exporter
    exports (``rlserve export torch``'s default method): the server samples from the
    distribution and returns its log-prob and the value."""

    def __init__(self, observations: int, actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(observations, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )  # fmt: skip
        self.actor = nn.Sequential(
            layer_init(nn.Linear(observations, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, actions), std=0.01),
        )  # fmt: skip

    def get_dist_and_value(self, x: Tensor) -> tuple[Categorical, Tensor]:
        return Categorical(logits=self.actor(x)), self.critic(x)


# ---------------------------------------------------------------------- trajectories


@dataclass
class Rollout:
    """What a PPO update needs, one row per step trained on (CleanRL's b_* arrays)."""

    observations: Tensor
    actions: Tensor
    log_probs: Tensor  # the behaviour policy's, as the server recorded them
    advantages: Tensor
    returns: Tensor
    staleness: np.ndarray  # trainer version - the step's model_version
    versions: np.ndarray  # the step's model_version
    keys: list[str] = field(default_factory=list)  # the step's Step.key

    def __len__(self) -> int:
        return len(self.actions)


class Trajectories:
    """Turns batches of records into advantages, episode by episode.

    Records arrive in order within an episode (every buffer keeps it), but a batch ends
    wherever it ends: most episodes are unfinished at a batch's end and continue in the next
    one. GAE for step t needs the value of step t + 1, which is recorded on step t + 1. So
    the last step of an unfinished episode is held back (``carried``) until its successor
    arrives with the next batch; then it is trained on, bootstrapped from that successor's
    recorded value. Everything else of the episode is trained on at once, its advantages
    truncated at the batch's end exactly as CleanRL truncates them at a rollout's end.

    The end of an episode: ``terminated`` bootstraps from 0. ``truncated`` (CartPole's
    500-step limit) bootstraps from the value recorded on the last step itself: records
    carry no final observation, the time limit is not part of the observation (the state
    did not end), and one step later the state is nearly the same, so V(s_T) stands in for
    V(s_T+1). Treating truncation as termination instead teaches the critic that a
    balanced pole is worth nothing whenever a time limit happens to strike.

    A gap in an episode (records dropped as over-stale) splits it: each contiguous part is
    handled as above; the step before the gap, whose successor is gone, is left out.
    """

    def __init__(self, gamma: float, gae_lambda: float, carry_versions: int = 100) -> None:
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.carry_versions = carry_versions  # a carried step older than this is forgotten
        self.carried: dict[str, Step] = {}
        self.returns: deque[float] = deque(maxlen=100)  # of episodes seen whole
        self.episodes = 0  # finished episodes seen whole
        self.partial_episodes = 0  # finished episodes with records missing (dropped)
        self._open: dict[str, tuple[int, float]] = {}  # episode -> next step, return so far

    def add(self, steps: Sequence[Step], version: int, bound: int | None) -> Rollout:
        """The rows to train on from ``steps`` (and the carried steps they complete);
        steps more than ``bound`` versions older than ``version`` are left out (``None``:
        no bound)."""
        episodes: dict[str, list[Step]] = {}
        for step in steps:
            episodes.setdefault(step.episode_id, []).append(step)
            self._count_return(step)
        rows: list[tuple[Step, float, float]] = []  # step, advantage, return
        for episode_id, run in episodes.items():
            carried = self.carried.pop(episode_id, None)
            if carried is not None and carried.step + 1 == run[0].step:
                run = [carried, *run]
            start = 0
            for i in range(1, len(run) + 1):
                if i == len(run) or run[i].step != run[i - 1].step + 1:  # an end, or a gap
                    rows.extend(self._advantages(run[start:i], before_gap=i < len(run)))
                    start = i
        for episode_id, step in list(self.carried.items()):
            if version - step.model_version > self.carry_versions:  # its worker stopped
                del self.carried[episode_id]
        if bound is not None:
            rows = [r for r in rows if version - r[0].model_version <= bound]
        observations = (
            np.stack([s.observation for s, _, _ in rows])
            if rows
            else np.empty((0, *steps[0].observation.shape))
        )
        return Rollout(
            observations=torch.as_tensor(observations, dtype=torch.float32),
            actions=torch.as_tensor(np.array([int(s.action) for s, _, _ in rows])),
            log_probs=torch.tensor([s.log_prob for s, _, _ in rows]),
            advantages=torch.tensor([a for _, a, _ in rows]),
            returns=torch.tensor([r for _, _, r in rows]),
            staleness=np.array([version - s.model_version for s, _, _ in rows], dtype=np.int64),
            versions=np.array([s.model_version for s, _, _ in rows], dtype=np.int64),
            keys=[s.key for s, _, _ in rows],
        )

    def _advantages(self, run: list[Step], before_gap: bool) -> list[tuple[Step, float, float]]:
        """GAE over one contiguous run of an episode's steps."""
        last = run[-1]
        if last.terminated:
            trained, next_value = run, 0.0
        elif last.truncated:
            trained, next_value = run, last.value  # V(s_T) for V(s_T+1): see the docstring
        else:  # the last step waits for its successor's value (never comes: a gap)
            if not before_gap:
                self.carried[last.episode_id] = last
            trained, next_value = run[:-1], last.value
        rows: list[tuple[Step, float, float]] = []
        advantage = 0.0
        for t in reversed(range(len(trained))):
            step = trained[t]
            following = run[t + 1].value if t + 1 < len(trained) else next_value
            delta = step.reward + self.gamma * following - step.value
            advantage = delta + self.gamma * self.gae_lambda * advantage
            rows.append((step, advantage, advantage + step.value))
        rows.reverse()
        return rows

    def _count_return(self, step: Step) -> None:
        """The return of every episode whose records all arrived (none dropped)."""
        expected, total = self._open.pop(step.episode_id, (0, 0.0))
        if step.step != expected:  # records missing: not a whole episode
            if step.terminated or step.truncated:
                self.partial_episodes += 1
            else:
                self._open[step.episode_id] = (-1, 0.0)  # never whole again
            return
        total += step.reward
        if step.terminated or step.truncated:
            self.returns.append(total)
            self.episodes += 1
        else:
            self._open[step.episode_id] = (expected + 1, total)

    @property
    def mean_return(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None


# ---------------------------------------------------------------------- PPO


def ppo_update(
    agent: Agent, optimizer: torch.optim.Optimizer, rollout: Rollout, args: Args
) -> dict[str, float]:
    """CleanRL's update. The ratio is taken against the log-probs the server recorded:
    for a record of an older version it starts away from 1 and clipping bounds the step,
    which is what lets PPO learn from slightly stale experience."""
    n = len(rollout)
    minibatch_size = max(1, n // args.num_minibatches)
    clipfracs, approx_kl = [], torch.tensor(0.0)
    pg_loss = v_loss = entropy_loss = torch.tensor(0.0)
    for _ in range(args.update_epochs):
        order = torch.randperm(n)
        for start in range(0, n - minibatch_size + 1, minibatch_size):
            mb = order[start : start + minibatch_size]
            distribution, value = agent.get_dist_and_value(rollout.observations[mb])
            logratio = distribution.log_prob(rollout.actions[mb]) - rollout.log_probs[mb]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())

            advantages = rollout.advantages[mb]
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            pg_loss1 = -advantages * ratio
            pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            v_loss = 0.5 * ((value.view(-1) - rollout.returns[mb]) ** 2).mean()
            entropy_loss = distribution.entropy().mean()
            loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
        if args.target_kl is not None and approx_kl > args.target_kl:
            break
    return {
        "policy_loss": pg_loss.item(),
        "value_loss": v_loss.item(),
        "entropy": entropy_loss.item(),
        "approx_kl": approx_kl.item(),
        "clipfrac": float(np.mean(clipfracs)) if clipfracs else 0.0,
    }


def ppo_scalars(update: dict[str, Any]) -> dict[str, float | None]:
    """One update's TensorBoard scalars, from its --log-json line (both PPO layouts)."""
    wall = update.get("wall_s") or 0.0
    return {
        "charts/mean_return": update.get("mean_return"),  # the last 100 episodes'
        "charts/episodes": update.get("episodes"),
        "charts/env_steps_per_s": update["env_steps"] / wall if wall else None,
        "rl/policy_version": update.get("version"),
        "rl/staleness_max": update.get("trained_staleness_max"),
        "rl/dropped": update.get("dropped"),
        "rl/log_prob_error": update.get("log_prob_error"),
        "update/ppo_s": update.get("ppo_s"),
        "update/export_s": update.get("export_s"),
        "update/publish_s": update.get("publish_s"),
        "update/busy_ratio": update.get("busy_ratio"),
        **{f"losses/{k}": update.get(k) for k in LOSSES},
    }


LOSSES = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")


def log_prob_error(published: dict[int, Agent], rollout: Rollout) -> float | None:
    """For the records chosen by a version the trainer still holds (``published``: version
    -> its weights), the largest difference between the log-prob the server recorded and
    the trainer's own, relative as the exporter's parity measures it: |a - b| / (1 + |b|).
    None when no record is of such a version."""
    worst: float | None = None
    for version, weights in published.items():
        rows = torch.as_tensor(rollout.versions == version)
        if not rows.any():
            continue
        with torch.no_grad():
            distribution, _ = weights.get_dist_and_value(rollout.observations[rows])
            ours = distribution.log_prob(rollout.actions[rows])
        error = float(((rollout.log_probs[rows] - ours).abs() / (1 + ours.abs())).max())
        worst = error if worst is None else max(worst, error)
    return worst


# ---------------------------------------------------------------------- export


# The first export's graph: later versions are that graph with the new weights (no tracing:
# ~0.05 s instead of ~0.9 s for this MLP), through the same parity gate (export/reweight.py).
reusable: Reweighable | None = None


def export(version: int, repository: Path, args: Args) -> Path:
    """``rlserve export torch __main__:agent --env ENV`` from Python: ONNX, parity against
    the torch module on sampled observations, the contract, and a verified write into
    ``repository/MODEL/VERSION/model.onnx``. Nothing is written if parity fails."""
    global reusable
    outcome = export_policy(
        load_source(TorchOptions(EXPORT_TARGET, env=args.env)),
        ParitySettings(samples=args.parity_samples),
        writer.destination(repository, args.model, version),
        progress=lambda _: None,
        reuse=reusable,
    )
    if outcome.path is None:
        sys.exit(f"version {version} failed the exporter's parity check:\n{outcome.report.table()}")
    reusable = outcome.reusable
    return outcome.path


def config_defaults(config: loop_config.LoopConfig) -> dict[str, Any]:
    """What the loop's configuration (``--config``) says, as defaults for the flags; its
    ``trainer:`` section holds this program's own settings by flag name (``batch_size``)."""
    unknown = sorted(set(config.trainer) - {f.name for f in dataclasses.fields(Args)})
    if unknown:
        raise ConfigError(f"trainer: unknown settings {unknown}; use this program's flag names "
                          "with '_' for '-', e.g. batch_size, checkpoint")  # fmt: skip
    model = config.inference_cluster.model
    return {
        "server": config.server_url(),
        "buffer": config.consumer_buffer_url(),
        "group": config.consumer_group,
        "consumer": config.consumer_name,
        "env": config.rollout.env_id,
        "max_staleness": config.sync_policy.max_staleness,
        "fallback": Fallback(config.sync_policy.fallback_strategy),
        "offline_buffer": config.offline_buffer_url(),
        "metrics_port": config.trainer_metrics_address()[1],
        **({"model": model} if model else {}),
        **config.trainer,
    }


def progress(message: str) -> None:
    print(f"ppo_trainer: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="co-located: with a --config whose cluster_mode is co-located (such as "
        "configs/rl_config.yaml) this program runs examples/ppo_colocated.py with the same "
        "arguments, which also takes --serve-repository, --serve-port, --serve-log, "
        "--predictions, --workers, --num-envs, --inference-interval, --training-interval "
        "and --max-hold-s (python examples/ppo_colocated.py --help)",
    )
    add_arguments(parser, Args)
    # Known flags only at first: the co-located runner has its own (--serve-repository, ...).
    args = from_namespace(Args, parser.parse_known_args()[0])
    config = None
    if args.config:  # the config's values become the defaults: flags still win
        try:
            config = loop_config.load(*args.config)
            if config.cluster_mode == "co-located":  # the same arguments, the other layout
                runpy.run_path(
                    str(Path(__file__).with_name("ppo_colocated.py")), run_name="__main__"
                )
            parser.set_defaults(**config_defaults(config))
        except ConfigError as e:
            parser.error(str(e))
    args = from_namespace(Args, parser.parse_args())
    if args.fallback == Fallback.OFFLINE and args.offline_buffer is None:
        parser.error("--fallback offline needs --offline-buffer URL (e.g. file:///tmp/offline)")
    if (problem := group_name_problem(args.group)) is not None:  # before any buffer is opened
        parser.error(f"--group: {problem}")
    checkpoint = args.checkpoint or Path("runs") / args.model / "agent.pt"
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)
    spaces = gym.make(args.env)
    shape, action_space = spaces.observation_space.shape or (), spaces.action_space
    if len(shape) != 1 or not isinstance(action_space, gym.spaces.Discrete):
        parser.error(f"--env {args.env}: this trainer takes vector observations, Discrete actions")
    agent = Agent(shape[0], int(action_space.n))

    # 0. --init-repository: the fresh agent becomes version 1, and the checkpoint.
    if args.init_repository is not None:
        path = export(1, args.init_repository, args)
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"version": 1, "agent": agent.state_dict()}, checkpoint)
        progress(f"wrote {path} and {checkpoint}")
        sys.exit(0)

    # 1. Start from the weights the server serves.
    if not checkpoint.is_file():
        sys.exit(f"no checkpoint at {checkpoint}: run with --init-repository DIR first and "
                 "serve DIR, or give --checkpoint")  # fmt: skip
    saved = torch.load(checkpoint, weights_only=True)
    agent.load_state_dict(saved["agent"])
    version = int(saved["version"])
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    if "optimizer" in saved:
        optimizer.load_state_dict(saved["optimizer"])
    token = os.environ.get(args.admin_token_env)
    if not token and config is not None and config.admin_token is not None:
        token = config.admin_token.get_secret_value()  # RLSERVE_LOOP_ADMIN_TOKEN
    if not token:
        sys.exit(f"${args.admin_token_env} is not set: set it to the server's admin token "
                 "(RLSERVE_ADMIN_TOKEN of `rlserve serve`) to push new versions")  # fmt: skip
    client = PolicyClient(args.server, admin_token=token, timeout_s=60.0)
    active = client.model(args.model)["active_version"]
    # Each update saves its checkpoint, stamped with the new version, BEFORE pushing that
    # version (below). A trainer killed between the two finds the server one version behind
    # its checkpoint: it pushes the checkpoint's weights as that version and goes on. The
    # checkpoint also names the steps of the batch that made it (``done``): a trainer killed
    # before committing that batch gets it again, and must not train on it twice. ``taken``
    # holds the run's books up to and including that batch (consumed, dropped, duplicates).
    if active == version - 1:
        resuming = Path(tempfile.mkdtemp(prefix="ppo-trainer-"))
        agent.eval()
        client.push(args.model, version, export(version, resuming, args))
        agent.train()
        shutil.rmtree(resuming, ignore_errors=True)
        progress(f"pushed version {version} from {checkpoint}: its push had not happened")
        active = version
    if active != version:
        sys.exit(f"{args.server} serves {args.model} version {active}, {checkpoint} holds "
                 f"version {version}: serve the repository this checkpoint was exported to, "
                 "or give the checkpoint of the active version")  # fmt: skip
    published = {version: copy.deepcopy(agent)}  # recent versions' weights, to check records

    # 2. The consumer: the sync controller bounds the staleness of every batch.
    options = config.buffer_options() if config is not None else None
    metrics = LoopMetrics()
    if args.metrics_port is not None:
        metrics.serve_metrics(args.metrics_port)
    dedupe = Deduplicator()
    for episode_id, step, ended in saved.get("done", []):  # already trained into `agent`
        dedupe.fresh(Step(episode_id, step, np.zeros(0), np.zeros(0), 0, 0, 0, ended, False, 0, 0))
    consumer = open_consumer(args.buffer, args.group, args.consumer or f"{args.group}-0", options)
    controller = SyncController(
        consumer,
        max_staleness=args.max_staleness,
        fallback=args.fallback,
        offline=open_producer(args.offline_buffer, options) if args.offline_buffer else None,
        metrics=metrics,
        version=version,
        dedupe=dedupe,
    )
    trajectories = Trajectories(args.gamma, args.gae_lambda)
    # Under `keep`, over-stale records are trained on: PPO's clipped ratio against their
    # recorded log-prob is the importance weighting that `keep` is for.
    bound = None if args.fallback == Fallback.KEEP else args.max_staleness
    log: TextIO | None = args.log_json.open("a") if args.log_json else None
    scalars = Scalars(logdir_of(args.logdir, f"{args.model}-ppo"))
    if scalars.logdir is not None:
        progress(f"TensorBoard event files in {scalars.logdir}: tensorboard --logdir {ROOT}")
    scratch = Path(tempfile.mkdtemp(prefix="ppo-trainer-"))
    started = last_progress = last_data = time.monotonic()
    busy_s, staleness_max, worst_error, status = 0.0, 0, 0.0, 1
    summary: dict[str, Any] = {}
    progress(f"version {version} of {args.model} at {args.server}; experience from {args.buffer}")
    outcome = RunOutcome(args.model, "mean return (last 100 episodes)", None, args.server)

    # 3. The loop: take a batch, learn, export, publish, commit.
    while True:
        batch = controller.next_batch(args.batch_size, timeout_s=1.0)
        learning = time.monotonic()
        books = controller.accounting()
        env_steps = books.consumed + books.dropped + books.routed_offline  # taken from the buffer
        if not batch.steps:
            if learning - last_data > args.idle_timeout_s:
                sys.exit(f"no experience arrived at {args.buffer} for {args.idle_timeout_s:g} s: "
                         "are the rollout workers running and publishing there?")  # fmt: skip
            continue
        last_data = learning
        rollout = trajectories.add(batch.steps, batch.version, bound)
        error = log_prob_error(published, rollout)
        if error is not None and error > 1e-4:
            sys.exit(f"records carry log-probs {error:.2g} away from the trainer's for their "
                     "version: the server does not serve the trainer's weights (serve the "
                     "repository --init-repository wrote; no other trainer may push)")  # fmt: skip
        worst_error = max(worst_error, error or 0.0)
        if args.anneal_lr:
            frac = max(0.0, 1.0 - env_steps / args.max_env_steps)
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        stats = ppo_update(agent, optimizer, rollout, args) if len(rollout) else {}
        exporting = time.monotonic()

        # Publish: export the new weights (parity checked), push them as the next version,
        # tell the controller; commit the batch only now that it has been used.
        agent.eval()
        path = export(version + 1, scratch, args)
        agent.train()
        pushing = time.monotonic()
        done = [(s.episode_id, s.step, s.terminated or s.truncated) for s in batch.steps]
        saving = checkpoint.with_name(checkpoint.name + ".tmp")  # replaced whole: never torn
        taken = {"consumed": books.consumed, "dropped": books.dropped,
                 "duplicates": books.duplicates}  # fmt: skip
        torch.save({"version": version + 1, "agent": agent.state_dict(),
                    "optimizer": optimizer.state_dict(), "done": done, "taken": taken},
                   saving)  # fmt: skip
        os.replace(saving, checkpoint)
        client.push(args.model, version + 1, path)
        shutil.rmtree(path.parent)
        version += 1
        published[version] = copy.deepcopy(agent)
        outcome.published(version, trajectories.mean_return)
        published.pop(version - CHECKED_VERSIONS, None)
        controller.set_version(version)
        controller.commit(batch)

        # Progress, from the records: returns, staleness (trainer version - record version).
        now = time.monotonic()
        busy_s += now - learning
        busy = busy_s / (now - started)
        metrics.busy(min(1.0, busy))
        trained_staleness = int(rollout.staleness.max()) if len(rollout) else 0
        staleness_max = max(staleness_max, trained_staleness)
        mean_return = trajectories.mean_return
        counts = np.unique(rollout.staleness, return_counts=True)
        summary = {
            "version": version,
            "env_steps": env_steps,
            "consumed": books.consumed,
            "dropped": books.dropped,
            "routed_offline": books.routed_offline,
            "trained": len(rollout),
            "batch_version": batch.version,
            "batch_staleness_max": max(batch.version - s.model_version for s in batch.steps),
            "trained_staleness_max": trained_staleness,
            "staleness_counts": {str(k): int(n) for k, n in zip(*counts, strict=True)},
            "mean_return": mean_return,
            "episodes": trajectories.episodes,
            "partial_episodes": trajectories.partial_episodes,
            "duplicates": books.duplicates,
            "log_prob_error": error,
            "busy_ratio": round(busy, 3),
            "ppo_s": round(exporting - learning, 3),
            "export_s": round(pushing - exporting, 3),
            "publish_s": round(now - pushing, 3),
            "wall_s": round(now - started, 2),
            **{k: round(v, 5) for k, v in stats.items()},
            **({"trained_keys": rollout.keys} if args.log_keys else {}),
        }
        if log is not None:
            log.write(json.dumps(summary) + "\n")
            log.flush()
        scalars.add(env_steps, ppo_scalars(summary))
        reached = len(trajectories.returns) == 100 and (mean_return or 0) >= args.target_return
        if now - last_progress >= args.progress_every_s or reached:
            last_progress = now
            shown = "-" if mean_return is None else f"{mean_return:.1f}"
            progress(
                f"{env_steps:,} env steps | mean return {shown} (last "
                f"{len(trajectories.returns)}) | version {version} | staleness max "
                f"{trained_staleness} (run {staleness_max}), dropped {books.dropped:,} | "
                f"busy {busy:.0%} | {now - started:.0f} s"
            )
        if reached:
            status = 0
            progress(f"reached a mean return of {mean_return:.1f} >= {args.target_return:g}")
            break
        if env_steps >= args.max_env_steps:
            progress(f"--max-env-steps {args.max_env_steps:,} taken, below the target return")
            break

    shutil.rmtree(scratch, ignore_errors=True)
    scalars.close()
    for line in outcome.lines(version):
        progress(line)
    summary.update(
        reached=status == 0,
        staleness_max=staleness_max,
        log_prob_error_max=worst_error,
        accounting=dataclasses.asdict(controller.accounting()),
        undecodable=consumer.counts.undecodable,  # poison records the buffer skipped
    )
    print(json.dumps(summary), flush=True)
    sys.exit(status)
