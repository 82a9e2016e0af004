"""Model repositories built with the real exporter, and servers started on them: SB3
policies (``repository``), and a language model exported by ``rlserve export lm`` from the
tiny TRL policies (``exported``, ``lm_repository``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import cli
from tests.e2e.server import Server
from tests.export.export_envs import DictEnv

if TYPE_CHECKING:
    from openai import OpenAI

    from examples.lm.tiny_policy import TinyPolicies

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "model_repository" / "cartpole"


def export_untrained(
    tmp: Path, repository: Path, name: str, env: Any, net_arch: list[int], seed: int = 0
) -> None:
    """An untrained SB3 PPO (weights are random, exactness is what matters) through the CLI.

    ``env`` is a gymnasium id or an environment; Dict observations get MultiInputPolicy."""
    from gymnasium import spaces
    from stable_baselines3 import PPO

    checkpoint = tmp / f"{name}-{seed}.zip"
    space = getattr(env, "observation_space", None)
    policy = "MultiInputPolicy" if isinstance(space, spaces.Dict) else "MlpPolicy"
    kwargs = {"net_arch": net_arch}
    PPO(policy, env, policy_kwargs=kwargs, seed=seed, device="cpu").save(checkpoint)
    # The CLI in this process (torch is imported already): tests/export/test_export_cli.py
    # runs it as a command.
    exported = cli.main(
        ["export", "sb3", str(checkpoint), "--name", name,
         "--model-repository", str(repository), "--parity-samples", "32"]
    )  # fmt: skip
    assert exported == 0, f"rlserve export sb3 {name} exited {exported}"


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cartpole (the bundled, trained demo), pendulum (Box actions), heavy (a wide MLP), and
    dict (Dict observations: an image, a discrete mode, a vector)."""
    tmp = tmp_path_factory.mktemp("models")
    repo = tmp / "repository"
    shutil.copytree(DEMO, repo / "cartpole")
    export_untrained(tmp, repo, "pendulum", "Pendulum-v1", [64, 64])
    export_untrained(tmp, repo, "heavy", "CartPole-v1", [1024, 1024])
    export_untrained(tmp, repo, "dict", DictEnv(), [32])
    return repo


def only(repository: Path, tmp: Path, *names: str, config: str | None = None) -> Path:
    """A repository holding some of the models (and a config.yaml for the first)."""
    repo = tmp / ("repo-" + "-".join(names))
    for name in names:
        shutil.copytree(repository / name, repo / name)
    if config is not None:
        (repo / names[0] / "config.yaml").write_text(config)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server on cartpole, pendulum and dict, shared by a test module."""
    tmp = tmp_path_factory.mktemp("server")
    repo = only(repository, tmp, "cartpole", "pendulum", "dict")
    running = Server.rlserve(repo, "--default-model", "cartpole", log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()


LM_MODEL = "llama"
# A generation's deadline is generation_deadline_ms; default_deadline_ms (one forward pass)
# is set short so that an LM route using it would fail its long generations.
LM_CONFIG = "default_deadline_ms: 200\ngeneration_deadline_ms: 30000\n"


@dataclass(frozen=True)
class Exported:
    versions: Path  # <versions>/llama/1 (the DPO policy) and /2 (its base model)
    sources: dict[int, Path]  # the checkpoint each version was exported from


@pytest.fixture(scope="session")
def exported(tiny_policies: TinyPolicies, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """The tiny Llama DPO policy (version 1) and its base (version 2), exported through
    the CLI with a short parity gate."""
    staging = tmp_path_factory.mktemp("lm-exports")
    sources = {1: tiny_policies.llama_dpo, 2: tiny_policies.llama_base}
    for version, source in sources.items():  # in this process, as export_untrained does
        exported = cli.main(
            ["export", "lm", str(source), "--name", LM_MODEL, "--model-repository",
             str(staging), "--version", str(version), "--prompts", "4", "--new-tokens", "16"]
        )  # fmt: skip
        assert exported == 0, f"rlserve export lm {source} exited {exported}"
    return Exported(staging, sources)


def lm_repository(exported: Exported, tmp: Path, *versions: int) -> Path:
    """A repository holding the language model's given versions (and its config.yaml)."""
    repo = tmp / "repository"
    for version in versions:
        source = exported.versions / LM_MODEL / str(version)
        shutil.copytree(source, repo / LM_MODEL / str(version))
    (repo / LM_MODEL / "config.yaml").write_text(LM_CONFIG)
    return repo


@pytest.fixture(scope="module")
def lm_server(exported: Exported, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server on the language model's version 1, shared by a test module."""
    tmp = tmp_path_factory.mktemp("lm-server")
    running = Server.rlserve(lm_repository(exported, tmp, 1), log=tmp / "log")
    running.wait_ready()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def openai_client(lm_server: Server) -> Iterator[OpenAI]:
    """The official ``openai`` client on ``lm_server`` (no retries: a test sees each answer)."""
    from openai import OpenAI  # only the language-model modules need it

    with OpenAI(
        base_url=f"{lm_server.url}/v1", api_key="unused", max_retries=0, timeout=60
    ) as client:
        yield client
