"""RecurrentPPO (sb3-contrib): the LSTM memory as graph inputs and outputs, a parity gate
over whole sequences, and episodes through onnxruntime that replay the source's own
``predict(obs, state, episode_start)`` loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch
from sb3_contrib import RecurrentPPO

import cli
from export import writer
from export.actor_critic.pipeline import ParitySettings, export_policy
from export.errors import ExportError
from export.modules.source import TorchOptions
from export.modules.source import load_source as load_torch_source
from export.sb3.source import Sb3Options, load_source
from kernel import contract
from kernel.contract import Algorithm, TensorRole
from tests.export import cleanrl_agents
from tests.export.export_envs import CartPoleNoVelocity, DictEnv, ImageEnv
from tests.export.export_policies import RECURRENT_HIDDEN
from tests.export.export_rollouts import OnnxRecurrentActor, SourceRecurrentActor, run_episode

HIDDEN = RECURRENT_HIDDEN


@pytest.fixture(scope="module")
def trained(recurrent_ppo: Path) -> tuple[Any, Path]:
    """A few thousand steps on CartPole with its velocities hidden (trained once per run)."""
    return RecurrentPPO.load(recurrent_ppo, device="cpu"), recurrent_ppo


def export(path: Path, repository: Path, name: str, *, trust: bool = False) -> Any:
    source = load_source(Sb3Options(path, trust_checkpoint=trust))
    destination = writer.destination(repository, name, None)
    return export_policy(source, ParitySettings(), destination, progress=lambda _: None)


@pytest.mark.parametrize("trust", [False, True])
def test_the_memory_is_in_the_contract_and_parity_plays_whole_sequences(
    trained: tuple[Any, Path], tmp_path: Path, trust: bool
) -> None:
    outcome = export(trained[1], tmp_path, "recurrent", trust=trust)
    table = outcome.report.table()
    assert outcome.path is not None, table
    assert "played as 8 sequences step by step" in table
    assert {row.output for row in outcome.report.rows} == {
        "action",
        "logits",
        "value",
        "next_state",
        "log_prob",
    }
    policy = contract.read(outcome.path)
    assert policy.algorithm is Algorithm.RECURRENT_PPO
    assert policy.state is not None
    assert [s.name for s in policy.state.segments] == ["actor.h", "actor.c", "critic.h", "critic.c"]
    assert policy.state.size == 4 * HIDDEN
    roles = {spec.name: spec.role for spec in policy.inputs}
    assert roles == {
        "obs": TensorRole.OBSERVATION,
        "state": TensorRole.STATE,
        "episode_start": TensorRole.EPISODE_START,
    }
    assert policy.output(TensorRole.NEXT_STATE) is not None
    # golden vectors are the first steps of a sequence: the first starts it, later ones
    # carry the state the step before returned
    golden = policy.golden
    assert [g.episode_start for g in golden] == [[True], [False], [False], [False]]
    assert not np.any(golden[0].state)
    assert np.any(golden[1].state)
    np.testing.assert_allclose(golden[1].state, golden[0].outputs["next_state"], atol=1e-6)


def test_episodes_through_onnxruntime_replay_the_sources_predict_loop(
    trained: tuple[Any, Path], tmp_path: Path
) -> None:
    model, path = trained
    outcome = export(path, tmp_path, "recurrent")
    assert outcome.path is not None
    env = CartPoleNoVelocity()
    for seed in range(4):
        theirs = run_episode(env, SourceRecurrentActor(model), seed)
        ours = run_episode(env, OnnxRecurrentActor(outcome.path), seed)
        assert len(ours.actions) == len(theirs.actions)
        assert [int(a) for a in ours.actions] == [int(a) for a in theirs.actions]


@pytest.mark.parametrize(
    ("policy", "env", "settings", "segments"),
    [
        ("MlpLstmPolicy", "CartPole-v1", {"shared_lstm": True, "enable_critic_lstm": False}, 2),
        ("MlpLstmPolicy", "CartPole-v1", {"enable_critic_lstm": False}, 2),
        ("MlpLstmPolicy", "Pendulum-v1", {"n_lstm_layers": 2}, 4),
        ("CnnLstmPolicy", ImageEnv, {}, 4),
        ("MultiInputLstmPolicy", DictEnv, {}, 4),
    ],
    ids=["shared-lstm", "no-critic-lstm", "gaussian-two-layers", "cnn", "multi-input"],
)
def test_every_lstm_arrangement_passes_parity(
    tmp_path: Path, policy: str, env: Any, settings: dict[str, Any], segments: int
) -> None:
    model = RecurrentPPO(
        policy,
        env if isinstance(env, str) else env(),
        n_steps=16,
        policy_kwargs={"lstm_hidden_size": 8, **settings},
        seed=0,
        device="cpu",
    )
    model.save(tmp_path / "policy.zip")
    outcome = export(tmp_path / "policy.zip", tmp_path / "models", "p")
    assert outcome.path is not None, outcome.report.table()
    written = contract.read(outcome.path)
    assert written.state is not None
    assert len(written.state.segments) == segments
    layers = settings.get("n_lstm_layers", 1)
    assert written.state.size == segments * layers * 8


def test_a_bidirectional_lstm_is_refused_naming_what_is_stepped(tmp_path: Path) -> None:
    model = RecurrentPPO(
        "MlpLstmPolicy",
        "CartPole-v1",
        n_steps=16,
        policy_kwargs={"lstm_hidden_size": 8, "lstm_kwargs": {"bidirectional": True}},
        seed=0,
        device="cpu",
    )
    model.save(tmp_path / "bidirectional.zip")
    with pytest.raises(ExportError, match="bidirectional") as refused:
        load_source(Sb3Options(tmp_path / "bidirectional.zip"))
    assert "steps unidirectional, sequence-first LSTMs" in refused.value.message


def test_the_written_file_takes_a_batch_of_sequences_at_different_steps(
    trained: tuple[Any, Path], tmp_path: Path
) -> None:
    """Rows are independent: a row's answer is the same alone or beside others."""
    outcome = export(trained[1], tmp_path, "recurrent")
    assert outcome.path is not None
    session = ort.InferenceSession(str(outcome.path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    obs = rng.uniform(-0.2, 0.2, (6, 2)).astype(np.float32)
    state = rng.normal(0, 0.3, (6, 4 * HIDDEN)).astype(np.float32)
    starts = np.array([True, False, False, True, False, False])
    together = session.run(None, {"obs": obs, "state": state, "episode_start": starts})
    for row in range(6):
        alone = session.run(
            None,
            {
                "obs": obs[row : row + 1],
                "state": state[row : row + 1],
                "episode_start": starts[row : row + 1],
            },
        )
        for joint, single in zip(together, alone, strict=True):
            np.testing.assert_allclose(joint[row : row + 1], single, atol=1e-6)


# ---------------------------------------------------------------------- CleanRL-style modules


def test_a_cleanrl_lstm_agent_exports_through_the_cli_and_replays_its_own_loop(
    tmp_path: Path,
) -> None:
    """CleanRL's ppo_atari_lstm Agent (its get_states as written): episodes through
    onnxruntime act as the agent's own loop does, fed the state it returned."""
    code = cli.main(
        [
            "export", "torch", "tests.export.cleanrl_agents:make_lstm_agent",
            "--env", "CartPole-v1", "--lstm", "lstm", "--name", "lstm_agent",
            "--model-repository", str(tmp_path),
        ]
    )  # fmt: skip
    assert code == 0
    path = tmp_path / "lstm_agent" / "1" / "model.onnx"
    policy = contract.read(path)
    assert policy.state is not None
    assert [s.name for s in policy.state.segments] == ["lstm.h", "lstm.c"]
    assert policy.state.size == 2 * 32
    agent = cleanrl_agents.make_lstm_agent()

    class AgentLoop:
        def __init__(self) -> None:
            self.state = (torch.zeros(1, 1, 32), torch.zeros(1, 1, 32))
            self.done = torch.ones(1)

        def __call__(self, observation: np.ndarray) -> int:
            with torch.no_grad():
                distribution, _, self.state = agent.get_dist_and_value(
                    torch.Tensor(observation[None]), self.state, self.done
                )
            self.done = torch.zeros(1)
            return int(distribution.probs.argmax())

    env = gym.make("CartPole-v1")
    for seed in range(3):
        theirs = run_episode(env, AgentLoop(), seed)
        ours = run_episode(env, OnnxRecurrentActor(path), seed)
        assert [int(a) for a in ours.actions] == [int(a) for a in theirs.actions]


def test_a_module_whose_method_does_not_return_the_state_is_refused(tmp_path: Path) -> None:
    options = TorchOptions(
        "tests.export.cleanrl_agents:make_cartpole_agent", env="CartPole-v1", lstm="actor"
    )
    with pytest.raises(ExportError, match=r"--lstm actor: DiscreteAgent.actor is Sequential"):
        load_torch_source(options)
    with pytest.raises(ExportError, match=r"must return \(distribution, value, \(h, c\)\)"):
        load_torch_source(
            TorchOptions(
                "tests.export.cleanrl_agents:make_lstm_agent",
                env="CartPole-v1",
                lstm="lstm",
                method="get_states",
            )
        )
