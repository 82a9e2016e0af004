"""Train a small PPO on CartPole-v1 and export it to examples/model_repository/cartpole/1/.

Read top to bottom: arguments, training, a deterministic evaluation, then the export with
rlserve's own exporter (the same code as ``rlserve export sb3``), which checks parity
against the trained model before it writes anything. The committed demo model is replaced
only after a successful export. ``make demo`` runs it.

    .venv/bin/python examples/train_cartpole.py [--total-timesteps 50000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

import cli
from cli.arguments import add_arguments, arg, from_namespace

HERE = Path(__file__).resolve().parent


@dataclass
class Args:
    seed: int = field(default=0, metadata=arg("seed for training and evaluation"))
    total_timesteps: int = field(default=50_000, metadata=arg("environment steps to train"))
    n_envs: int = field(default=8, metadata=arg("parallel training environments"))
    eval_episodes: int = field(default=10, metadata=arg("deterministic evaluation episodes"))
    min_return: float = field(default=400.0, metadata=arg("refuse to export below this"))
    checkpoint: Path = field(
        default=Path("runs/cartpole/ppo_cartpole.zip"), metadata=arg("where to save the .zip")
    )
    model_repository: Path = field(
        default=HERE / "model_repository", metadata=arg("where the export goes")
    )


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
add_arguments(parser, Args)
args = from_namespace(Args, parser.parse_args())
torch.set_num_threads(2)

# 1. Train. Hyperparameters after the RL Baselines3 Zoo's CartPole-v1 PPO entry.
start = time.perf_counter()
model = PPO(
    "MlpPolicy",
    make_vec_env("CartPole-v1", n_envs=args.n_envs, seed=args.seed),
    n_steps=32,
    batch_size=256,
    gae_lambda=0.8,
    gamma=0.98,
    n_epochs=20,
    ent_coef=0.0,
    learning_rate=lambda progress: 1e-3 * progress,
    clip_range=lambda progress: 0.2 * progress,
    seed=args.seed,
    device="cpu",
)
model.learn(total_timesteps=args.total_timesteps)
print(f"trained {args.total_timesteps} steps in {time.perf_counter() - start:.0f} s")

# 2. Evaluate the deterministic policy, one seeded episode at a time.
env = gym.make("CartPole-v1")
returns = []
for episode in range(args.eval_episodes):
    observation, _ = env.reset(seed=args.seed + 1000 + episode)
    total, done = 0.0, False
    while not done:
        action, _ = model.predict(observation, deterministic=True)
        observation, reward, terminated, truncated, _ = env.step(int(action))
        total += float(reward)
        done = terminated or truncated
    returns.append(total)
mean_return = float(np.mean(returns))
print(f"mean return over {args.eval_episodes} deterministic episodes: {mean_return:.1f}")
if mean_return < args.min_return:
    sys.exit(f"mean return {mean_return:.1f} < {args.min_return}: train longer, not exporting")

# 3. Save the checkpoint and export it with the real exporter (parity first) into a scratch
#    repository; only a successful export replaces the demo's cartpole/1.
args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
model.save(args.checkpoint)
with tempfile.TemporaryDirectory() as scratch:
    # The checkpoint this script just saved: its pickled settings (the learning-rate
    # schedule is a function) are ours, so the exporter may unpickle them.
    argv = ["export", "sb3", str(args.checkpoint), "--name", "cartpole", "--trust-checkpoint"]
    status = cli.main([*argv, "--model-repository", scratch, "--version", "1"])
    if status != 0:
        sys.exit(status)
    target = args.model_repository / "cartpole" / "1"
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(Path(scratch) / "cartpole" / "1", target)
print(f"demo model: {target / 'model.onnx'}")
