"""Deterministic episodes, driven by the source framework or by onnxruntime on an exported file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest

from kernel import contract

Act = Callable[[Any], Any]


@dataclass(frozen=True)
class Episode:
    actions: list[np.ndarray]
    total_reward: float


def run_episode(env: gym.Env[Any, Any], act: Act, seed: int, max_steps: int = 500) -> Episode:
    observation, _ = env.reset(seed=seed)
    actions: list[np.ndarray] = []
    total = 0.0
    for _ in range(max_steps):
        action = act(observation)
        actions.append(np.asarray(action))
        observation, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        if terminated or truncated:
            break
    return Episode(actions, total)


class OnnxActor:
    """The exported file's deterministic action for one raw observation, as a server feeds it."""

    def __init__(self, path: Path) -> None:
        self.policy = contract.read(path)
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def __call__(self, observation: Any) -> Any:
        feeds = self.policy.observation_feeds(observation)
        (action,) = self.session.run(["action"], feeds)
        return action[0]


def sb3_actor(model: Any) -> Act:
    def act(observation: Any) -> Any:
        action, _ = model.predict(observation, deterministic=True)
        return action

    return act


def assert_same_episode(ours: Episode, theirs: Episode, atol: float = 0.0) -> None:
    assert len(ours.actions) == len(theirs.actions)
    for step, (a, b) in enumerate(zip(ours.actions, theirs.actions, strict=True)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=f"step {step}")
    assert ours.total_reward == pytest.approx(theirs.total_reward, rel=1e-6, abs=atol)


class SourceRecurrentActor:
    """A recurrent SB3 policy's deterministic action, as its own ``predict`` loop takes it:
    the state it returned fed back, ``episode_start`` true on the first step. One per episode."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.state: Any = None
        self.start = True

    def __call__(self, observation: Any) -> Any:
        action, self.state = self.model.predict(
            observation[np.newaxis],
            state=self.state,
            episode_start=np.array([self.start]),
            deterministic=True,
        )
        self.start = False
        return action[0]


class OnnxRecurrentActor(OnnxActor):
    """The exported recurrent file, fed the ``next_state`` it returned. One per episode."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        assert self.policy.state is not None
        self.state = np.zeros((1, self.policy.state.size), np.float32)
        self.start = True

    def __call__(self, observation: Any) -> Any:
        feeds = self.policy.observation_feeds(observation)
        feeds["state"], feeds["episode_start"] = self.state, np.array([self.start])
        action, self.state = self.session.run(["action", "next_state"], feeds)
        self.start = False
        return action[0]
