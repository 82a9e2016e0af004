"""The ``rlserve export`` arguments, declared once (see :mod:`cli.arguments`).

Light on purpose: the CLI parses these on every ``rlserve`` call, so torch and the sources
are imported only when ``load_source`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from cli.arguments import arg
from export.lm.graph_kind import GraphKind
from export.sb3.layout import ImageLayout
from kernel.contract import Algorithm

if TYPE_CHECKING:
    from export.actor_critic.pipeline import ParitySettings
    from export.actor_critic.source import PolicySource
    from export.lm.pipeline import LmParitySettings
    from export.lm.source import CausalLM


class TorchAlgorithm(StrEnum):
    PPO = "ppo"
    A2C = "a2c"
    SAC = "sac"
    TD3 = "td3"
    DDPG = "ddpg"
    DQN = "dqn"


class Sb3Algorithm(StrEnum):
    PPO = "ppo"
    A2C = "a2c"
    SAC = "sac"
    TD3 = "td3"
    DDPG = "ddpg"
    DQN = "dqn"
    QRDQN = "qrdqn"
    TQC = "tqc"
    MASKABLE_PPO = "maskable_ppo"


class LanguageModelAlgorithm(StrEnum):
    DPO = "dpo"
    GRPO = "grpo"


@dataclass(kw_only=True)
class DestinationArgs:
    """Where the model goes: DIR/NAME/VERSION."""

    name: str = field(
        metadata=arg(
            "model name: the directory under --model-repository (1 to 128 letters, digits, "
            "'_', '-', '.')",
            metavar="NAME",
        )
    )
    model_repository: Path = field(
        metadata=arg(
            "model repository; the model is written to DIR/NAME/VERSION/model.onnx",
            metavar="DIR",
        )
    )
    version: int | None = field(
        default=None,
        metadata=arg(
            "version to write (default: the next free one); existing ones are refused",
            metavar="N",
        ),
    )


@dataclass(kw_only=True)
class CommonArgs(DestinationArgs):
    """Where an actor-critic policy goes, and how hard parity checks it."""

    tolerance: float = field(
        default=1e-5,
        metadata=arg(
            "parity tolerance of float outputs and log-probs: "
            "|onnx - source| <= ATOL x (1 + |source|)",
            metavar="ATOL",
        ),
    )
    parity_samples: int = field(
        default=256,
        metadata=arg("observations sampled from the observation space for parity", metavar="N"),
    )
    parity_observations: Path | None = field(
        default=None,
        metadata=arg(
            "also check parity on these raw observations: .npy, or .npz with one array per "
            "Dict key",
            metavar="FILE",
        ),
    )
    seed: int = field(
        default=0, metadata=arg("seed for sampling parity observations and actions", metavar="N")
    )

    def load_source(self) -> PolicySource:
        raise NotImplementedError  # each source's arguments know how to load it

    def parity_settings(self) -> ParitySettings:
        from export.actor_critic.pipeline import ParitySettings

        return ParitySettings(
            tolerance=self.tolerance,
            samples=self.parity_samples,
            observations_file=self.parity_observations,
            seed=self.seed,
        )


@dataclass(kw_only=True)
class Sb3Args(CommonArgs):
    checkpoint: Path = field(
        metadata=arg(
            "PPO, A2C, SAC, TD3, DDPG or DQN checkpoint saved by Stable-Baselines3's "
            "model.save() (or QR-DQN, TQC, MaskablePPO: sb3-contrib's)",
            positional=True,
            metavar="CHECKPOINT.zip",
        )
    )
    vecnormalize: Path | None = field(
        default=None,
        metadata=arg(
            "VecNormalize statistics (VecNormalize.save()) to bake into the graph",
            metavar="STATS.pkl",
        ),
    )
    no_normalize: bool = field(
        default=False,
        metadata=arg(
            "export a model trained under VecNormalize without its statistics (it will then "
            "take already-normalised observations)"
        ),
    )
    algorithm: Sb3Algorithm | None = field(
        default=None,
        metadata=arg(
            "force the algorithm (default: read from the checkpoint's policy class and "
            "settings); it must be one of the policy class's algorithms"
        ),
    )
    image_layout: ImageLayout = field(
        default=ImageLayout.HWC,
        metadata=arg(
            "layout of image observations as the environment emits them: hwc (SB3 transposed "
            "them for its CNN; the graph does the same) or chw (already channels-first)"
        ),
    )
    trust_checkpoint: bool = field(
        default=False,
        metadata=arg(
            "unpickle the checkpoint's settings and the --vecnormalize file as "
            "Stable-Baselines3 does, which runs any code they name; without it only what a "
            "policy checkpoint needs (spaces, arrays, SB3's own classes) is read and anything "
            "else is refused by name. Give it only for files you or your team saved"
        ),
    )

    def load_source(self) -> PolicySource:
        from export.sb3.source import Sb3Options, load_source

        algorithm = Algorithm(self.algorithm.value) if self.algorithm is not None else None
        return load_source(
            Sb3Options(
                checkpoint=self.checkpoint,
                vecnormalize=self.vecnormalize,
                no_normalize=self.no_normalize,
                algorithm=algorithm,
                image_layout=self.image_layout,
                trust_checkpoint=self.trust_checkpoint,
            )
        )


@dataclass(kw_only=True)
class TorchArgs(CommonArgs):
    target: str = field(
        metadata=arg(
            "the policy: an importable module or a .py file, and an nn.Module instance or a "
            "zero-argument factory in it",
            positional=True,
            metavar="MODULE_OR_FILE:ATTR",
        )
    )
    checkpoint: Path | None = field(
        default=None,
        metadata=arg(
            "state_dict to load into the module (torch.save(model.state_dict()))",
            metavar="STATE.pt",
        ),
    )
    env: str | None = field(
        default=None,
        metadata=arg(
            "gymnasium id whose observation and action spaces the policy acts in",
            metavar="GYM_ID",
        ),
    )
    observation_space: str | None = field(
        default=None,
        metadata=arg(
            'observation space as JSON instead of --env, e.g. \'{"type": "Box", "shape": [4]}\'',
            metavar="JSON",
        ),
    )
    action_space: str | None = field(
        default=None,
        metadata=arg(
            'action space as JSON instead of --env, e.g. \'{"type": "Discrete", "n": 2}\'',
            metavar="JSON",
        ),
    )
    method: str | None = field(
        default=None,
        metadata=arg(
            "method to call on a batch of observations; it returns (torch distribution, "
            "value) for ppo and a2c (default get_dist_and_value), and for the off-policy "
            "algorithms (default forward) the Q-values (dqn), the action in the Box's bounds "
            "(td3, ddpg) or (mean, log_std) before tanh (sac)",
            metavar="NAME",
        ),
    )
    obs_norm: Path | None = field(
        default=None,
        metadata=arg(
            "NormalizeObservation statistics to bake in: .npz with mean, var, optional clip "
            "and epsilon",
            metavar="STATS.npz",
        ),
    )
    algorithm: TorchAlgorithm = field(
        default=TorchAlgorithm.PPO,
        metadata=arg("algorithm the module was trained with (what its method returns)"),
    )
    lstm: str | None = field(
        default=None,
        metadata=arg(
            "a recurrent policy (CleanRL's ppo_atari_lstm): the module's nn.LSTM attribute. "
            "The method is then called as method(obs, (h, c), done) and returns "
            "(distribution, value, (h, c)), states [layers, B, hidden] as the LSTM takes "
            "them, done the float episode starts; the served policy takes and returns the "
            "state (docs/export.md)",
            metavar="ATTR",
        ),
    )

    def load_source(self) -> PolicySource:
        from export.modules.source import TorchOptions, load_source

        return load_source(
            TorchOptions(
                target=self.target,
                checkpoint=self.checkpoint,
                env=self.env,
                observation_space=self.observation_space,
                action_space=self.action_space,
                method=self.method,
                obs_norm=self.obs_norm,
                algorithm=Algorithm(self.algorithm.value),
                lstm=self.lstm,
            )
        )


@dataclass(kw_only=True)
class LmArgs(DestinationArgs):
    checkpoint: Path = field(
        metadata=arg(
            "the directory a TRL trainer (or save_pretrained) wrote: config.json and "
            "model.safetensors, or a PEFT adapter's adapter_config.json",
            positional=True,
            metavar="CHECKPOINT_DIR",
        )
    )
    base: Path | None = field(
        default=None,
        metadata=arg(
            "the base model directory a PEFT adapter is merged into (default: the adapter "
            "config's base_model_name_or_path, when that is a local directory)",
            metavar="BASE_DIR",
        ),
    )
    algorithm: LanguageModelAlgorithm | None = field(
        default=None,
        metadata=arg(
            "the algorithm the policy was trained with (default: read from TRL's model card "
            "or training_args.bin; none when neither says)"
        ),
    )
    prompts: int = field(
        default=16,
        metadata=arg(
            "parity prompts made from the tokenizer (text and chat-template prompts)",
            metavar="N",
        ),
    )
    new_tokens: int = field(
        default=32,
        metadata=arg("greedy tokens generated per parity prompt", metavar="N"),
    )
    atol: float = field(
        default=1e-4,
        metadata=arg(
            "parity tolerance of log-probs (natural log, absolute): greedy tokens' and given "
            "completions'; the greedy tokens themselves must be identical",
            metavar="ATOL",
        ),
    )
    golden: int = field(
        default=4,
        metadata=arg(
            "parity prompts kept as golden prompts in the contract (the server decodes them "
            "again when it loads the version)",
            metavar="N",
        ),
    )
    graph: GraphKind = field(
        default=GraphKind.GQA,
        metadata=arg(
            "the decoder graph: gqa, onnxruntime-genai's model builder (GroupQueryAttention, "
            "the faster); torch, torch.onnx with the attention spelled out (no "
            "onnxruntime-genai needed)"
        ),
    )

    def load_source(self) -> CausalLM:
        from export.lm.source import LoadOptions, load

        algorithm = Algorithm(self.algorithm.value) if self.algorithm is not None else None
        return load(LoadOptions(checkpoint=self.checkpoint, base=self.base, algorithm=algorithm))

    def parity_settings(self) -> LmParitySettings:
        from export.lm.pipeline import LmParitySettings

        return LmParitySettings(
            prompts=self.prompts, new_tokens=self.new_tokens, atol=self.atol, golden=self.golden
        )
