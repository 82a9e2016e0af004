"""The benchmark's model repository, built with the real exporter from untrained SB3 policies.

- ``cartpole``: the bundled demo (a trained 64x64 MLP, 4 observations, 2 actions);
- ``mlp``: a Humanoid-sized actor-critic (376 observations, 256x256 actor and critic,
  17 continuous actions in [-0.4, 0.4]);
- ``cnn``: Nature-CNN on stacked Atari frames (4x84x84 uint8, 6 discrete actions).

Weights are random (seeded): what a benchmark measures does not depend on them. Each model
is exported through ``rlserve export sb3``, so parity is proven as for any user's model.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "model_repository" / "cartpole"


@dataclass(frozen=True)
class BenchModel:
    name: str
    policy: str  # the SB3 policy class
    observation: dict[str, Any]  # gymnasium Box arguments
    action: dict[str, Any]  # {"n": k} for Discrete, else Box arguments
    net_arch: list[int] | None = None
    export_flags: tuple[str, ...] = ()


MLP = BenchModel(
    "mlp",
    "MlpPolicy",
    {"low": -np.inf, "high": np.inf, "shape": (376,), "dtype": np.float32},
    {"low": -0.4, "high": 0.4, "shape": (17,), "dtype": np.float32},
    [256, 256],
)
CNN = BenchModel(
    "cnn",
    "CnnPolicy",
    {"low": 0, "high": 255, "shape": (4, 84, 84), "dtype": np.uint8},
    {"n": 6},
    export_flags=("--image-layout", "chw"),  # frames arrive channel-first, as stacked
)


def build_repository(root: Path, models: tuple[BenchModel, ...] = (MLP, CNN)) -> Path:
    """``root``/cartpole (the demo) and every model of ``models``, exported once."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "cartpole").exists():
        shutil.copytree(DEMO, root / "cartpole")
    for model in models:
        if not (root / model.name / "1" / "model.onnx").exists():
            print(f"bench: exporting {model.name} ({model.policy})", file=sys.stderr, flush=True)
            _export(root, model)
    return root


def _export(root: Path, model: BenchModel) -> None:
    from stable_baselines3 import PPO

    checkpoint = root.parent / f"{model.name}.zip"
    policy_kwargs = None if model.net_arch is None else {"net_arch": model.net_arch}
    agent = PPO(model.policy, _SpacesOnly(model), policy_kwargs=policy_kwargs, seed=0, device="cpu")
    agent.save(checkpoint)
    subprocess.run(
        [sys.executable, "-m", "cli", "export", "sb3", str(checkpoint), "--name", model.name,
         "--model-repository", str(root), "--parity-samples", "32", *model.export_flags],
        check=True, capture_output=True,
    )  # fmt: skip
    checkpoint.unlink()


def _SpacesOnly(model: BenchModel) -> Any:  # noqa: N802 - builds an env instance
    """An environment that only declares the model's spaces (SB3 needs one to build a policy)."""
    import gymnasium as gym
    from gymnasium import spaces

    class SpacesOnly(gym.Env[Any, Any]):
        observation_space = spaces.Box(**model.observation)
        action_space = (
            spaces.Discrete(model.action["n"])
            if "n" in model.action
            else spaces.Box(**model.action)
        )

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action: Any) -> Any:
            return self.observation_space.sample(), 0.0, False, False, {}

    return SpacesOnly()
