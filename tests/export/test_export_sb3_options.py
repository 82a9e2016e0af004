"""SB3 checkpoints the exporter refuses, and the options that change what it exports."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import PPO, SAC

from export import writer
from export.actor_critic.action_spaces import checked
from export.actor_critic.pipeline import ParitySettings, export_policy
from export.errors import ExportError
from export.sb3.layout import ImageLayout
from export.sb3.source import Sb3Options, load_source
from kernel import contract
from kernel.spaces import Discrete, MultiDiscrete
from tests.export.export_policies import TrainedPolicy


def _export(options: Sb3Options, repository: Path, parity: ParitySettings | None = None) -> Path:
    source = load_source(options)
    destination = writer.destination(repository, "policy", None)
    outcome = export_policy(source, parity or ParitySettings(), destination, lambda _: None)
    assert outcome.path is not None, outcome.report.table()
    return outcome.path


def test_gsde_policies_are_refused(models_dir: Path) -> None:
    path = models_dir / "gsde.zip"
    PPO("MlpPolicy", "Pendulum-v1", use_sde=True, device="cpu").save(path)
    with pytest.raises(ExportError, match=r"gSDE \(use_sde=True\)"):
        load_source(Sb3Options(path))


def test_off_policy_gsde_policies_are_refused_too(models_dir: Path) -> None:
    path = models_dir / "sac_gsde.zip"
    SAC("MlpPolicy", "Pendulum-v1", buffer_size=100, use_sde=True, device="cpu").save(path)
    with pytest.raises(ExportError, match=r"gSDE \(use_sde=True\)"):
        load_source(Sb3Options(path))


@pytest.mark.parametrize(
    "space", [Discrete(n=3, start=1), MultiDiscrete(nvec=(3, 2), start=(0, 1))]
)
def test_discrete_actions_that_do_not_start_at_zero_are_refused(
    space: Discrete | MultiDiscrete,
) -> None:
    with pytest.raises(ExportError, match="start"):
        checked(space)


def test_statistics_of_another_environment_are_refused(
    cartpole_ppo: TrainedPolicy, pendulum_vecnormalize: TrainedPolicy
) -> None:
    options = Sb3Options(cartpole_ppo.checkpoint, vecnormalize=pendulum_vecnormalize.vecnormalize)
    with pytest.raises(ExportError, match=r"shape \(3,\), but the observation space's is \(4,\)"):
        load_source(options)


def test_a_file_that_is_not_a_vecnormalize_pickle_is_refused(
    cartpole_ppo: TrainedPolicy, tmp_path: Path
) -> None:
    bad = tmp_path / "stats.pkl"
    bad.write_bytes(b"\x80\x04K\x01.")  # pickle of the int 1
    with pytest.raises(ExportError, match="holds a int, not a VecNormalize"):
        load_source(Sb3Options(cartpole_ppo.checkpoint, vecnormalize=bad))


def test_vecnormalize_and_no_normalize_together_are_refused(
    pendulum_vecnormalize: TrainedPolicy,
) -> None:
    options = Sb3Options(
        pendulum_vecnormalize.checkpoint,
        vecnormalize=pendulum_vecnormalize.vecnormalize,
        no_normalize=True,
    )
    with pytest.raises(ExportError, match="contradict"):
        load_source(options)


def test_the_algorithm_can_be_forced(cartpole_ppo: TrainedPolicy) -> None:
    from kernel.contract import Algorithm

    assert load_source(Sb3Options(cartpole_ppo.checkpoint)).algorithm is Algorithm.PPO
    forced = load_source(Sb3Options(cartpole_ppo.checkpoint, algorithm=Algorithm.A2C))
    assert forced.algorithm is Algorithm.A2C


def test_chw_image_layout_takes_channels_first_images(
    image_cnn: TrainedPolicy, tmp_path: Path
) -> None:
    path = _export(Sb3Options(image_cnn.checkpoint, image_layout=ImageLayout.CHW), tmp_path)
    policy = contract.read(path)
    assert policy.inputs[0].shape == ["batch", 3, 36, 36]
    (image,) = policy.preprocessing.images
    assert (image.layout, image.transposed_to_chw) == ("CHW", False)


def test_parity_also_runs_on_observations_from_a_file(
    cartpole_ppo: TrainedPolicy, tmp_path: Path
) -> None:
    env = gym.make("CartPole-v1")
    observed = [env.reset(seed=seed)[0] for seed in range(10)]
    np.save(tmp_path / "observed.npy", np.stack(observed))
    parity = ParitySettings(samples=16, observations_file=tmp_path / "observed.npy")
    source = load_source(Sb3Options(cartpole_ppo.checkpoint))
    outcome = export_policy(source, parity, writer.destination(tmp_path, "p", None), lambda _: None)
    assert outcome.report.samples == 26
    assert outcome.path is not None


def test_a_parity_file_that_does_not_fit_the_space_is_refused(
    cartpole_ppo: TrainedPolicy, tmp_path: Path
) -> None:
    np.save(tmp_path / "wrong.npy", np.zeros((5, 3), dtype=np.float32))
    parity = ParitySettings(observations_file=tmp_path / "wrong.npy")
    source = load_source(Sb3Options(cartpole_ppo.checkpoint))
    with pytest.raises(ExportError, match=r"wrong.npy: expected shape \(4,\)"):
        export_policy(source, parity, writer.destination(tmp_path, "p", None), lambda _: None)
    assert not (tmp_path / "p").exists()


class _Reach(gym.Env[dict[str, np.ndarray], np.ndarray]):
    """A goal-conditioned task (HER's Dict layout): move a point to a goal."""

    def __init__(self) -> None:
        box = gym.spaces.Box(-1, 1, (2,), np.float32)
        names = ("observation", "achieved_goal", "desired_goal")
        self.observation_space = gym.spaces.Dict({name: box for name in names})  # type: ignore[assignment]
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self._pos = self._goal = np.zeros(2, np.float32)
        self._t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self._pos, "achieved_goal": self._pos, "desired_goal": self._goal}

    def reset(
        self, *, seed: int | None = None, options: object = None
    ) -> tuple[dict[str, np.ndarray], dict[str, object]]:
        super().reset(seed=seed)
        self._pos, self._t = np.zeros(2, np.float32), 0
        self._goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._obs(), {}

    def compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
        return -(np.linalg.norm(achieved - desired, axis=-1) > 0.1).astype(np.float32)

    def step(
        self, action: np.ndarray
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, object]]:
        self._pos = np.clip(self._pos + 0.1 * action, -1, 1).astype(np.float32)
        self._t += 1
        reward = float(self.compute_reward(self._pos, self._goal, {}))
        return self._obs(), reward, False, self._t >= 20, {}


def test_a_sac_policy_trained_with_her_exports_with_its_goal_conditioned_dict(
    models_dir: Path, tmp_path: Path
) -> None:
    from stable_baselines3 import HerReplayBuffer

    path = models_dir / "her.zip"
    settings = {"n_sampled_goal": 4, "goal_selection_strategy": "future"}
    model = SAC(
        "MultiInputPolicy", _Reach(), replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=settings, learning_starts=40, buffer_size=500, seed=0, device="cpu",
    )  # fmt: skip
    model.learn(60)
    model.save(path)
    written = contract.read(_export(Sb3Options(path), tmp_path))
    assert written.algorithm.value == "sac"
    assert sorted(i.name for i in written.inputs) == [
        "obs.achieved_goal", "obs.desired_goal", "obs.observation",
    ]  # fmt: skip
