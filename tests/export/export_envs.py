"""Small gymnasium environments for the export tests: one per space the exporter must handle.

Each runs a fixed number of steps; observations come from the env's seeded generator and
the reward depends on the action, so two drivers agree only if they act identically.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

HORIZON = 24
IMAGE_SHAPE = (36, 36, 3)  # HWC; 36x36 is the smallest NatureCNN accepts


class _FixedHorizonEnv(gym.Env[Any, Any]):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self._steps = 0
        self._observation = self._observe()
        return self._observation, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reward = float(self._reward(self._observation, np.asarray(action)))
        self._steps += 1
        self._observation = self._observe()
        return self._observation, reward, False, self._steps >= HORIZON, {}

    def _observe(self) -> Any:
        return self.observation_space.sample()  # seeded by reset() through np_random

    def _reward(self, observation: Any, action: np.ndarray) -> float:
        raise NotImplementedError


class MultiDiscreteEnv(_FixedHorizonEnv):
    """Pick, per dimension, the bucket the first observation values fall into."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.MultiDiscrete([3, 2])

    def _observe(self) -> Any:
        return self.np_random.uniform(-1, 1, size=4).astype(np.float32)

    def _reward(self, observation: Any, action: np.ndarray) -> float:
        target = np.array([np.digitize(observation[0], [-1 / 3, 1 / 3]), observation[1] > 0])
        return -float(np.abs(action - target).sum())


class MultiBinaryEnv(_FixedHorizonEnv):
    """Switch on the bits whose observation value is positive."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.MultiBinary(3)

    def _observe(self) -> Any:
        return self.np_random.uniform(-1, 1, size=3).astype(np.float32)

    def _reward(self, observation: Any, action: np.ndarray) -> float:
        return float(np.sum(action == (observation > 0)))


class ImageEnv(_FixedHorizonEnv):
    """An HWC uint8 image; pick the brightest colour channel."""

    observation_space = spaces.Box(0, 255, IMAGE_SHAPE, np.uint8)
    action_space = spaces.Discrete(3)

    def _observe(self) -> Any:
        return self.np_random.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8)

    def _reward(self, observation: Any, action: np.ndarray) -> float:
        return float(int(action) == int(observation.mean(axis=(0, 1)).argmax()))


class DictEnv(_FixedHorizonEnv):
    """A Dict of a float vector, a discrete mode and an HWC image; a 2-d continuous action."""

    observation_space = spaces.Dict(
        {
            "camera": spaces.Box(0, 255, IMAGE_SHAPE, np.uint8),
            "mode": spaces.Discrete(3),
            "position": spaces.Box(-5.0, 5.0, (3,), np.float32),
        }
    )
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _observe(self) -> Any:
        return {
            "camera": self.np_random.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8),
            "mode": np.int64(self.np_random.integers(0, 3)),
            "position": self.np_random.uniform(-5, 5, size=3).astype(np.float32),
        }

    def _reward(self, observation: Any, action: np.ndarray) -> float:
        target = np.tanh(observation["position"][:2]) * (observation["mode"] - 1)
        return -float(np.square(np.clip(action, -1, 1) - target).sum())


class CartPoleNoVelocity(gym.ObservationWrapper[np.ndarray, int, np.ndarray]):
    """CartPole with its velocities hidden (position and angle only): a partially observed
    task, where a policy needs memory to tell which way the pole is moving."""

    def __init__(self, env: gym.Env[np.ndarray, int] | None = None) -> None:
        super().__init__(env if env is not None else gym.make("CartPole-v1"))
        box = self.env.observation_space
        assert isinstance(box, spaces.Box)
        self.observation_space = spaces.Box(box.low[[0, 2]], box.high[[0, 2]], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[[0, 2]].astype(np.float32)


class VectorsEnv(_FixedHorizonEnv):
    """A Dict of two float vectors (what a features view by observation key builds); a
    2-d continuous action."""

    observation_space = spaces.Dict(
        {
            "body": spaces.Box(-5.0, 5.0, (3,), np.float32),
            "goal": spaces.Box(-5.0, 5.0, (2,), np.float32),
        }
    )
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _reward(self, observation: Any, action: np.ndarray) -> float:
        target = np.tanh(observation["goal"] - observation["body"][:2])
        return -float(np.square(np.clip(action, -1, 1) - target).sum())
