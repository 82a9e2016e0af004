"""The GRPO trainer's objective against TRL's: on the same batch (a group of completions
sampled from the tiny Llama, with behaviour log-probs a step away from the policy's), our
loss and its gradient equal ``trl.GRPOTrainer``'s (its defaults: ``loss_type="dapo"``,
``beta=0``, ``epsilon=0.2``), and our group advantages equal its ``scale_rewards="group"``
ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from examples.grpo_trainer import completion_log_probs, group_advantages, groups_of, grpo_loss
from loop.experience import Completion
from tests.loop.buffers.contract import make_completion


def sampled_group(model: Any, tokenizer: Any, size: int = 6) -> list[Completion]:
    """A group of ``size`` sampled completions of one prompt, rewards 0/1 by index, and
    behaviour log-probs the policy's own shifted by a little noise (as after a step)."""
    prompt = tokenizer("The cat", return_tensors="pt")
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    out = model.generate(
        **prompt, do_sample=True, max_new_tokens=6, num_return_sequences=size, top_k=0,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    start = prompt["input_ids"].shape[1]
    completions = []
    for index, row in enumerate(out):
        tokens = row[start:].numpy()
        if tokenizer.eos_token_id in tokens:  # as the server answers: up to EOS, included
            tokens = tokens[: list(tokens).index(tokenizer.eos_token_id) + 1]
        noise = torch.randn(len(tokens), generator=generator).numpy() * 0.05
        completions.append(
            Completion(
                group_id="g", index=index, group_size=size,
                prompt_ids=prompt["input_ids"][0].numpy().astype(np.int32),
                completion_ids=tokens.astype(np.int32), log_probs=noise,
                reward=float(index % 3 == 0), finish_reason="stop", model_version=1, served_at=0.0,
            )
        )  # fmt: skip
    (group,) = groups_of(completions)
    with torch.no_grad():
        policy = completion_log_probs(model, group).double()
    return [  # the noise on the policy's own log-probs
        dataclasses.replace(c, log_probs=policy[i, : len(c.completion_ids)].numpy() + c.log_probs)
        for i, c in enumerate(completions)
    ]


def trl_trainer(policy: Path, tmp: Path) -> Any:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        per_device_train_batch_size=6, num_generations=6, beta=0.0, disable_tqdm=True,
        activation_checkpointing=False,
    )  # fmt: skip

    def no_reward(completions: list[Any], **_: Any) -> list[float | None]:
        return [0.0] * len(completions)  # the loss is given its advantages: never called

    return GRPOTrainer(
        model=str(policy), reward_funcs=no_reward,
        args=args, train_dataset=Dataset.from_list([{"prompt": "The cat"}] * 6),
        processing_class=AutoTokenizer.from_pretrained(policy),
    )  # fmt: skip


def test_our_step_equals_trls_on_the_same_batch(tiny_policies: Any, tmp_path: Path) -> None:
    trainer = trl_trainer(tiny_policies.llama_base, tmp_path)
    model, tokenizer = trainer.model, trainer.processing_class
    model.eval()
    completions = sampled_group(model, tokenizer)
    (group,) = groups_of(completions)
    tokens = group.mask.sum()

    model.zero_grad()
    loss, _ = grpo_loss(
        completion_log_probs(model, group), group.behaviour, group.advantages, group.mask, 0.2
    )
    ours = loss / tokens
    ours.backward()
    our_grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    inputs = {
        "prompt_ids": group.prompt_ids.unsqueeze(0).expand(len(completions), -1),
        "prompt_mask": torch.ones(len(completions), len(group.prompt_ids), dtype=torch.long),
        "completion_ids": group.completion_ids,
        "completion_mask": group.mask.long(),
        "advantages": group.advantages.float(),
        "old_per_token_logps": group.behaviour.float(),
        "num_items_in_batch": tokens,
    }
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5, abs=1e-7)
    for ours_grad, param in zip(our_grads, model.parameters(), strict=True):
        torch.testing.assert_close(ours_grad, param.grad, rtol=1e-4, atol=1e-7)


def test_group_advantages_are_trls_scaled_by_group() -> None:
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    groups = ["a"] * 4 + ["b"] * 4
    advantages = group_advantages(rewards, groups)
    grouped = torch.tensor(rewards).view(2, 4)
    expected = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    np.testing.assert_allclose(advantages, expected.view(-1).numpy())
    assert (advantages[4:] == 0).all()  # a group that agrees teaches nothing


def test_a_batch_with_part_of_a_group_is_refused() -> None:
    with pytest.raises(ValueError, match="group g: 2 of its 4 completions"):
        groups_of([make_completion("g", 0), make_completion("g", 1)])
