"""CleanRL-style torch modules export with parity, a contract, and identical episodes."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from export import writer
from export.actor_critic.pipeline import ExportOutcome, ParitySettings, export_policy
from export.errors import ExportError
from export.modules.source import TorchOptions, load_source
from kernel import contract
from kernel.contract import PolicyContract
from tests.export import cleanrl_agents
from tests.export.export_rollouts import OnnxActor, assert_same_episode, run_episode

AGENTS_FILE = Path(cleanrl_agents.__file__)
NORM: dict[str, Any] = {
    "mean": np.array([0.1, -0.2, 0.5]),
    "var": np.array([0.5, 2.0, 4.0]),
    "clip": 5.0,
}


@pytest.fixture(scope="module")
def cartpole_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights unlike the factory's own, so only a loaded checkpoint reproduces them."""
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("torch") / "agent.pt"
    torch.save(cleanrl_agents.DiscreteAgent(4, 2).state_dict(), path)
    return path


@pytest.fixture(scope="module")
def obs_norm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("torch") / "obs_norm.npz"
    np.savez(path, **NORM)
    return path


def _export(options: TorchOptions, repository: Path) -> tuple[ExportOutcome, PolicyContract]:
    source = load_source(options)
    destination = writer.destination(repository, "agent", None)
    outcome = export_policy(source, ParitySettings(), destination, progress=lambda _: None)
    assert outcome.path is not None, outcome.report.table()
    print(f"\n{options.target}\n{outcome.report.table()}")
    return outcome, contract.read(outcome.path)


def test_a_discrete_module_with_a_state_dict_exports_and_acts_like_torch(
    cartpole_state: Path, tmp_path: Path
) -> None:
    options = TorchOptions(
        "tests.export.cleanrl_agents:make_cartpole_agent",
        checkpoint=cartpole_state,
        env="CartPole-v1",
    )
    outcome, policy = _export(options, tmp_path)
    assert policy.source.framework == "torch"
    assert policy.source.framework_version == torch.__version__
    assert policy.source.checkpoint == "agent.pt"
    assert policy.source.sha256 == hashlib.sha256(cartpole_state.read_bytes()).hexdigest()
    assert policy.source.policy_class == "tests.export.cleanrl_agents.DiscreteAgent"
    assert policy.distribution.kind.value == "categorical"
    assert [o.name for o in policy.outputs] == ["action", "logits", "value"]
    agent = cleanrl_agents.DiscreteAgent(4, 2)
    agent.load_state_dict(torch.load(cartpole_state, weights_only=True))

    def torch_action(observation: np.ndarray) -> int:
        with torch.no_grad():
            distribution, _ = agent.get_dist_and_value(torch.Tensor(observation[None]))
        return int(distribution.probs.argmax())

    assert outcome.path is not None
    for seed in (0, 1):
        ours = run_episode(gym.make("CartPole-v1"), OnnxActor(outcome.path), seed)
        theirs = run_episode(gym.make("CartPole-v1"), torch_action, seed)
        assert_same_episode(ours, theirs)


def test_a_continuous_module_file_with_obs_norm_exports_and_acts_like_torch(
    obs_norm: Path, tmp_path: Path
) -> None:
    options = TorchOptions(f"{AGENTS_FILE}:pendulum_agent", env="Pendulum-v1", obs_norm=obs_norm)
    outcome, policy = _export(options, tmp_path)
    assert policy.distribution.kind.value == "diag_gaussian"
    assert [o.name for o in policy.outputs] == ["action", "mean", "log_std", "value"]
    assert policy.preprocessing.normalization is not None
    assert policy.preprocessing.normalization.clip == 5.0
    assert policy.preprocessing.normalization.epsilon == 1e-8
    assert policy.preprocessing.action_clip is True
    agent = cleanrl_agents.make_pendulum_agent()  # the same seeded weights as the file's

    def torch_action(observation: np.ndarray) -> np.ndarray:
        scaled = (observation - NORM["mean"]) / np.sqrt(NORM["var"] + 1e-8)
        x = torch.Tensor(np.clip(scaled, -5.0, 5.0)[None])
        with torch.no_grad():
            distribution, _ = agent.get_dist_and_value(x)
        return np.clip(distribution.mean.numpy()[0], -2.0, 2.0)

    assert outcome.path is not None
    for seed in (0, 1):
        ours = run_episode(gym.make("Pendulum-v1"), OnnxActor(outcome.path), seed)
        theirs = run_episode(gym.make("Pendulum-v1"), torch_action, seed)
        assert_same_episode(ours, theirs, atol=1e-5)


@pytest.mark.parametrize(
    ("factory", "action_space", "kind"),
    [
        ("make_binary_agent", '{"type": "MultiBinary", "n": 3}', "bernoulli"),
        (
            "make_multidiscrete_agent",
            '{"type": "MultiDiscrete", "nvec": [3, 2]}',
            "multi_categorical",
        ),
        ("make_independent_gaussian_agent", '{"type": "Box", "shape": [2]}', "diag_gaussian"),
    ],
)
def test_spaces_given_as_json_cover_every_distribution_kind(
    factory: str, action_space: str, kind: str, tmp_path: Path
) -> None:
    dims = 4 if "multidiscrete" in factory else 3
    observation_space = f'{{"type": "Box", "shape": [{dims}], "low": -2, "high": 2}}'
    options = TorchOptions(
        f"tests.export.cleanrl_agents:{factory}",
        observation_space=observation_space,
        action_space=action_space,
    )
    _, policy = _export(options, tmp_path)
    assert policy.distribution.kind.value == kind
    assert f'"type": "{policy.action_space.type}"' in action_space


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (TorchOptions("cleanrl_agents", env="CartPole-v1"), "MODULE_OR_FILE:ATTR"),
        (
            TorchOptions("tests.export.cleanrl_agents:nothing", env="CartPole-v1"),
            "no attribute 'nothing'",
        ),
        (TorchOptions("no_such_module_here:x", env="CartPole-v1"), "importing"),
        (
            TorchOptions("tests.export.cleanrl_agents:np", env="CartPole-v1"),
            "zero-argument factory",
        ),
        (
            TorchOptions("tests.export.cleanrl_agents:make_cartpole_agent", env="NoSuchEnv-v9"),
            "--env",
        ),
        (TorchOptions("tests.export.cleanrl_agents:make_cartpole_agent"), "--env GYM_ID"),
        (
            TorchOptions(
                "tests.export.cleanrl_agents:make_cartpole_agent", env="CartPole-v1", method="act"
            ),
            "--method act",
        ),
        (
            TorchOptions("tests.export.cleanrl_agents:make_cartpole_agent", env="Acrobot-v1"),
            "shapes cannot be multiplied",
        ),
        (
            TorchOptions(
                "tests.export.cleanrl_agents:make_cartpole_agent",
                observation_space='{"type": "Box", "shape": [4]}',
                action_space='{"type": "Discrete", "n": 3}',
            ),
            "categorical of width 2 distribution, but the action space",
        ),
        (
            TorchOptions(
                "tests.export.cleanrl_agents:make_cartpole_agent",
                env="CartPole-v1",
                observation_space='{"type": "Box", "shape": [4]}',
            ),
            "give one of the two forms",
        ),
        (
            TorchOptions(
                "tests.export.cleanrl_agents:make_cartpole_agent",
                observation_space='{"type": "Circle"}',
                action_space='{"type": "Discrete", "n": 2}',
            ),
            "--observation-space",
        ),
    ],
)
def test_bad_modules_and_spaces_are_refused_with_the_fix(
    options: TorchOptions, message: str
) -> None:
    with pytest.raises(ExportError, match=message.replace("(", r"\(")) as raised:
        load_source(options)
    assert "\n" not in raised.value.message


def test_a_state_dict_that_does_not_fit_the_module_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pendulum.pt"
    torch.save(cleanrl_agents.make_pendulum_agent().state_dict(), path)
    options = TorchOptions(
        "tests.export.cleanrl_agents:make_cartpole_agent", checkpoint=path, env="CartPole-v1"
    )
    with pytest.raises(ExportError, match="does not fit the module"):
        load_source(options)


def test_module_weights_without_a_checkpoint_are_checksummed(tmp_path: Path) -> None:
    options = TorchOptions("tests.export.cleanrl_agents:make_cartpole_agent", env="CartPole-v1")
    _, policy = _export(options, tmp_path)
    assert policy.source.checkpoint == "tests.export.cleanrl_agents:make_cartpole_agent"
    assert len(policy.source.sha256) == 64
