"""GRPO for a language-model policy served by rlserve: the objective and the learner.

The prompt workers (``loop/grpo``) publish groups of completions sampled by the server, each
with its token ids, the log-probs the serving version gave them (the behaviour policy) and
its reward. This file learns from such a batch, reading top to bottom:

1. **advantages**, relative to the group: ``(r - mean) / (std + 1e-4)`` over the group's
   completions (std with Bessel's correction), as TRL's ``scale_rewards="group"``;
2. **log-probs** of each completion token under the policy being trained: one forward pass
   per group (its completions share the prompt, so only completions are padded, on the
   right, and no position moves), at temperature 1, as the server computes them;
3. the **check**: before the first step on a batch, those log-probs must equal the recorded
   behaviour log-probs within 1e-4 (the batch's version is the trainer's own): else the
   server does not serve the trainer's weights, and the run stops;
4. the **clipped objective** against the behaviour log-probs, per token:
   ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)``, summed over the batch's
   completion tokens and divided by their number (TRL's default ``loss_type="dapo"``; no
   KL term, TRL's default ``beta=0``); ``updates_per_batch`` steps on each batch (GRPO's
   iterations, mu);
5. the **export** of the new weights with ``rlserve export lm``'s parity gate, into a
   hidden folder of the served model repository, from where the runner pushes it by path
   (a language model's version travels with its tokenizer). The graph is built once; each
   later version is that graph with the new weights (``export.lm.gqa``: byte for byte what
   the builder would build, in milliseconds instead of seconds), through the same gate.

``examples/grpo_colocated.py`` runs it with the server, co-located. TRL's loss is the
reference: ``tests/loop/test_grpo_objective.py`` checks a step of ours against
``trl.GRPOTrainer``'s on the same batch.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loop.controller import Batch
from loop.experience import Completion

EXPORTS = ".grpo"  # inside the served repository: where new versions are written


@dataclass
class Hyper:
    learning_rate: float = 5e-3
    epsilon: float = 0.2  # the ratio's clip
    updates_per_batch: int = 4  # optimizer steps on each batch (mu)
    max_grad_norm: float = 1.0
    log_prob_tolerance: float = 1e-4  # trainer vs recorded log-probs, same version
    parity_prompts: int = 4  # the export's parity gate: prompts ...
    parity_new_tokens: int = 16  # ... and greedy tokens each
    lora_rank: int | None = None  # train a LoRA adapter of this rank (None: full weights)


# -- 1. advantages ------------------------------------------------------------------------


def group_advantages(rewards: np.ndarray, groups: Sequence[str]) -> np.ndarray:
    """Each reward against its group's: centred on the group's mean, scaled by its std."""
    advantages = np.zeros(len(rewards), np.float64)
    members: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    for indices in members.values():
        values = rewards[indices]
        spread = values.std(ddof=1) if len(values) > 1 else 0.0
        advantages[indices] = (values - values.mean()) / (spread + 1e-4)
    return advantages


# -- 2. log-probs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One group's completions as tensors: right-padded ids, their mask, the recorded
    behaviour log-probs and each completion's advantage."""

    prompt_ids: torch.Tensor  # [P]
    completion_ids: torch.Tensor  # [G, T], padded with 0
    mask: torch.Tensor  # [G, T], 1 for a completion token
    behaviour: torch.Tensor  # [G, T], 0 where padded
    advantages: torch.Tensor  # [G]
    version: int  # the version that sampled it


def groups_of(completions: Sequence[Completion]) -> list[Group]:
    """The batch's completions by group, each group whole (a runner publishes groups whole)."""
    rewards = np.array([c.reward for c in completions])
    advantages = group_advantages(rewards, [c.group_id for c in completions])
    members: dict[str, list[int]] = {}
    for index, completion in enumerate(completions):
        members.setdefault(completion.group_id, []).append(index)
    groups = []
    for group_id, indices in members.items():
        size = completions[indices[0]].group_size
        if len(indices) != size:
            raise ValueError(f"group {group_id}: {len(indices)} of its {size} completions")
        longest = max(len(completions[i].completion_ids) for i in indices)
        ids = torch.zeros(len(indices), longest, dtype=torch.long)
        mask = torch.zeros(len(indices), longest)
        behaviour = torch.zeros(len(indices), longest, dtype=torch.float64)
        for row, index in enumerate(indices):
            tokens = completions[index].completion_ids
            ids[row, : len(tokens)] = torch.from_numpy(tokens.astype(np.int64))
            mask[row, : len(tokens)] = 1
            behaviour[row, : len(tokens)] = torch.tensor(completions[index].log_probs)
        prompt = torch.from_numpy(completions[indices[0]].prompt_ids.astype(np.int64))
        version = completions[indices[0]].model_version
        advantage = torch.from_numpy(advantages[indices])
        groups.append(Group(prompt, ids, mask, behaviour, advantage, version))
    return groups


def whole_groups(completions: Sequence[Completion]) -> tuple[list[Completion], int]:
    """The completions of the groups a batch holds whole, and how many it holds a part of
    (a batch cut short mid-group by its timeout; their completions are left out)."""
    counts: dict[str, int] = {}
    for completion in completions:
        counts[completion.group_id] = counts.get(completion.group_id, 0) + 1
    whole = [c for c in completions if counts[c.group_id] == c.group_size]
    return whole, len({c.group_id for c in completions if counts[c.group_id] != c.group_size})


def completion_log_probs(model: Any, group: Group) -> torch.Tensor:
    """[G, T]: each completion token's log-prob given the prompt and the tokens before it."""
    size, length = group.completion_ids.shape
    prompt = group.prompt_ids.unsqueeze(0).expand(size, -1)
    ids = torch.cat([prompt, group.completion_ids], dim=1)
    attention = torch.cat([torch.ones_like(prompt), group.mask.long()], dim=1)
    logits = model(input_ids=ids, attention_mask=attention).logits
    start = prompt.shape[1] - 1  # the logits at position p predict the token at p + 1
    scores = torch.log_softmax(logits[:, start : start + length].float(), dim=-1)
    return scores.gather(-1, group.completion_ids.unsqueeze(-1)).squeeze(-1) * group.mask


# -- 4. the clipped objective -------------------------------------------------------------


def grpo_loss(
    log_probs: torch.Tensor,
    behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped objective's sum over the tokens of ``mask`` (divide by the batch's token
    count), and the number of tokens whose ratio was clipped."""
    ratio = torch.exp(log_probs - behaviour.to(log_probs.dtype))
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
    gain = advantages.to(log_probs.dtype).unsqueeze(1)
    per_token = -torch.min(ratio * gain, clipped * gain)
    outside = ((ratio - clipped).abs() > 0) & (mask > 0)
    return (per_token * mask).sum(), outside.sum()


# -- the learner --------------------------------------------------------------------------


class GRPOLearner:
    """A co-located runner's learner (``loop.colocated.Learner``): the steps above on each
    batch, then the export of ``next_version`` into ``repository/.grpo/<model>``."""

    def __init__(
        self, policy: Path, repository: Path, model_name: str, hyper: Hyper | None = None
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging

        logging.disable_progress_bar()  # save_pretrained's, on every export
        self.hyper = hyper or Hyper()
        self.source, self.repository, self.model_name = policy, repository, model_name
        self.model: Any = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
        if self.hyper.lora_rank is not None:
            self.model = _with_lora(self.model, self.hyper.lora_rank)
        self.tokenizer = AutoTokenizer.from_pretrained(policy)
        trained = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapter
        self.optimizer = torch.optim.AdamW(trained, lr=self.hyper.learning_rate)
        self.exports = repository / EXPORTS
        self.last: dict[str, Any] = {}
        self.export_timings: Any = None  # the last export's parts (export.lm.pipeline.Timings)
        self._graph: Any = None  # the first export's graph, given each new version's weights
        self._previous: Path | None = None

    def update(self, batch: Batch[Completion], next_version: int) -> Path:
        """Learn from the batch's whole groups, export ``next_version``; its model file.
        The log-prob check covers the groups of the trainer's own version (all of them,
        co-located; decoupled, older ones are off-policy: the clipped ratio corrects them)."""
        started = time.monotonic()
        completions, partial = whole_groups(batch.steps)
        groups = groups_of(completions)
        own = [g for g in groups if g.version == batch.version]
        error = self.log_prob_error(own) if own else None
        if error is not None and error > self.hyper.log_prob_tolerance:
            raise AssertionError(
                f"the trainer's log-probs are {error:.2g} away from those the server recorded "
                f"for version {batch.version}: the server does not serve the trainer's weights"
            )
        tokens = max(1.0, sum(float(g.mask.sum()) for g in groups))
        self.model.train()
        losses, clipped = [], 0
        for _ in range(self.hyper.updates_per_batch):
            self.optimizer.zero_grad()
            total = torch.zeros(())
            for group in groups:
                log_probs = completion_log_probs(self.model, group)
                loss, outside = grpo_loss(
                    log_probs, group.behaviour, group.advantages, group.mask, self.hyper.epsilon
                )
                (loss / tokens).backward()
                total += loss.detach()
                clipped += int(outside)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.hyper.max_grad_norm)
            self.optimizer.step()
            losses.append(float(total) / tokens)
        self.model.eval()
        learned = time.monotonic()
        path = self.export(next_version)
        rewards = [c.reward for c in completions]
        self.last = {
            "completions": len(completions),
            "groups": len(groups),
            "partial_groups": partial,
            "staleness_max": max((batch.version - g.version for g in groups), default=0),
            "tokens": int(tokens),
            "mean_reward": float(np.mean(rewards)) if rewards else None,
            "log_prob_error": error,  # None: no group of the trainer's version to check
            "checked_groups": len(own),
            "loss": losses[0],
            "clipped_fraction": clipped / max(1.0, tokens * self.hyper.updates_per_batch),
            "learn_s": round(learned - started, 3),
            "export_s": round(time.monotonic() - learned, 3),
            **{f"export_{k}": round(v, 3) for k, v in vars(self.export_timings).items()},
        }
        return path

    def merged(self) -> Any:
        """The policy as one model: with LoRA, a copy with the adapter merged into the base
        weights (what is exported and served); else the model itself."""
        if self.hyper.lora_rank is None:
            return self.model
        import copy

        return copy.deepcopy(self.model).merge_and_unload()

    @torch.no_grad()
    def log_prob_error(self, groups: Sequence[Group]) -> float:
        """The largest gap between the trainer's log-probs and the recorded ones."""
        self.model.eval()
        worst = 0.0
        for group in groups:
            ours = completion_log_probs(self.model, group).double()
            gap = ((ours - group.behaviour).abs() * group.mask).max()
            worst = max(worst, float(gap))
        return worst

    def export(self, version: int) -> Path:
        """The weights as ``version``, through ``rlserve export lm`` (parity gate included),
        in the repository's hidden exports folder; the file to push."""
        from export import writer
        from export.lm import pipeline
        from export.lm.source import LoadOptions, load

        if self._previous is not None:  # pushed by now: the server copied it
            shutil.rmtree(self._previous.parent, ignore_errors=True)
        weights = self.exports / "weights"
        shutil.rmtree(weights, ignore_errors=True)
        self.merged().save_pretrained(weights)
        self.tokenizer.save_pretrained(weights)
        for side in ("generation_config.json",):
            if (self.source / side).is_file():
                shutil.copyfile(self.source / side, weights / side)
        source = load(LoadOptions(checkpoint=weights))
        settings = pipeline.LmParitySettings(
            prompts=self.hyper.parity_prompts, new_tokens=self.hyper.parity_new_tokens
        )
        destination = writer.Destination(self.exports, self.model_name, version)
        shutil.rmtree(destination.version_dir, ignore_errors=True)
        outcome = pipeline.export_language_model(
            source, settings, destination, _quiet, reuse=self._graph
        )
        self._graph = outcome.reusable  # the next export gives it the new weights
        if outcome.path is None:
            raise AssertionError(f"version {version}: parity failed\n{outcome.report.table()}")
        self.export_timings = outcome.timings
        self._previous = outcome.path / "model.onnx"
        return self._previous


def start(args: Any) -> GRPOLearner:
    """Both scripts' start: torch seeded and threaded, the learner on ``--policy``, and the
    policy exported as version 1 of the served repository unless it is there already."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)
    hyper = Hyper(
        learning_rate=args.learning_rate,
        updates_per_batch=args.updates_per_batch,
        lora_rank=args.lora_rank,
    )
    learner = GRPOLearner(args.policy, args.serve_repository, args.model, hyper)
    first = args.serve_repository / args.model / "1"
    if not first.is_dir():
        exported = learner.export(1)
        first.parent.mkdir(parents=True, exist_ok=True)
        exported.parent.rename(first)
    return learner


def _with_lora(model: Any, rank: int) -> Any:
    """``model`` with a LoRA adapter on its attention projections (peft; only it trains)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.0, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )  # fmt: skip
    return get_peft_model(model, config)


# -- the loop's configuration ---------------------------------------------------------


def config_defaults(files: Sequence[str], parser: Any) -> Any:
    """The loop's configuration (``--config``: the reference ``rl_config.yaml``,
    ``decoupled_config.yaml``, ``sync_policy.yaml`` as written) as the defaults of the
    GRPO scripts' flags, which still win: co-located, ``task_schedule`` and
    ``gpu_allocation``; decoupled, the server (``inference_cluster``), the buffer
    (``data_buffer``) and ``sync_policy`` (``offline``: the ``<topic>_offline`` stream);
    both, the ``trainer:`` section by flag name. The configuration, or None without one."""
    from kernel.errors import ConfigError
    from loop import config as loop_config

    if not files:
        return None
    try:
        config = loop_config.load(*files)
    except ConfigError as error:
        parser.error(str(error))
    flags = {action.dest for action in parser._actions}
    unknown = sorted(set(config.trainer) - flags)
    if unknown:
        parser.error(f"trainer: unknown settings {unknown}; use the flags' names with '_'")
    defaults: dict[str, Any]
    if config.cluster_mode == "co-located":
        schedule = config.task_schedule
        defaults = {
            "inference_interval": schedule.inference_interval,
            "training_interval": schedule.training_interval,
        }
    else:
        policy = config.sync_policy
        defaults = {
            "server": config.server_url(),
            "buffer": config.consumer_buffer_url(),
            "max_staleness": policy.max_staleness,
            "fallback": policy.fallback_strategy,
            "offline_buffer": config.offline_buffer_url(),
        }
    parser.set_defaults(**{k: v for k, v in defaults.items() if k in flags}, **config.trainer)
    return config


def _quiet(message: str) -> None:
    """The exporter's progress lines: not shown (a run prints its own)."""


def grpo_scalars(version: dict[str, Any]) -> dict[str, float | None]:
    """One version's TensorBoard scalars, from its --log-json line (both GRPO layouts)."""
    wall = version.get("wall_s") or 0.0
    tokens = version.get("sampled_tokens")
    return {
        "reward/mean": version.get("mean_reward"),
        "reward/window": version.get("window_reward"),
        "rl/policy_version": version.get("version"),
        "rl/staleness_max": version.get("staleness_max"),
        "rl/log_prob_error": version.get("log_prob_error"),
        "losses/loss": version.get("loss"),
        "losses/clipped_fraction": version.get("clipped_fraction"),
        "update/latency_s": version.get("update_latency_s"),
        "update/learn_s": version.get("learn_s"),
        "update/export_s": version.get("export_s"),
        "update/push_s": version.get("update_push_s", version.get("push_s")),
        "charts/sampled_tokens_per_s": tokens / wall if tokens and wall else None,
        "charts/completions": version.get("completions"),
    }


def progress(message: str) -> None:
    print(f"grpo: {message}", file=sys.stderr, flush=True)
