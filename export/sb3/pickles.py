"""Reading the pickles a Stable-Baselines3 checkpoint holds without running their code.

``model.save()`` cloudpickles every setting JSON cannot hold (the spaces, the policy class,
the schedules, the last observations) into the zip's ``data``, and ``VecNormalize.save()``
pickles the whole wrapper. Unpickling calls whatever a pickle names, so a checkpoint from a
colleague, a bucket or a hub can run any code when it is loaded.

:func:`loads` admits only the names such a checkpoint needs — gymnasium's spaces, numpy's
arrays, dtypes and random generators, plain containers, SB3's policy, buffer and schedule
classes (replay buffers, train frequencies and action noise of off-policy algorithms too),
torch's activation and optimiser classes, VecNormalize and its running statistics —
and refuses any other by name before it is called. ``--trust-checkpoint`` unpickles as
Stable-Baselines3 itself does.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from export.errors import ExportError

_NUMPY_CORE = ("numpy.core", "numpy._core")  # numpy 1 and numpy 2 spell it differently


def _numpy(*names: tuple[str, str]) -> set[tuple[str, str]]:
    return {(f"{core}.{module}", name) for core in _NUMPY_CORE for module, name in names}


# (module, name) pairs, matched exactly: a dotted name or another module is refused.
_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        # numpy: arrays, scalars, dtypes, and the random generators gymnasium's spaces keep
        *_numpy(
            ("multiarray", "_reconstruct"),
            ("multiarray", "scalar"),
            ("numeric", "_frombuffer"),
        ),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        *{
            ("numpy.random._pickle", name)
            for name in ("__generator_ctor", "__bit_generator_ctor", "__randomstate_ctor")
        },
        *{
            (f"numpy.random._{name.lower()}", name)
            for name in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
        },
        ("numpy.random._pcg64", "PCG64DXSM"),
        ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
        ("numpy.random.bit_generator", "SeedSequence"),
        ("numpy.random._generator", "Generator"),
        ("numpy.random.mtrand", "RandomState"),
        # plain containers and values
        *{
            ("builtins", name)
            for name in (
                "object",
                "set",
                "frozenset",
                "slice",
                "complex",
                "bytearray",
                "range",
                "float",
                "int",
            )
        },
        ("collections", "OrderedDict"),
        ("collections", "deque"),
        ("copyreg", "_reconstructor"),
        # gymnasium's spaces
        *{
            (f"gymnasium.spaces.{module}", name)
            for module, name in (
                ("box", "Box"),
                ("discrete", "Discrete"),
                ("multi_discrete", "MultiDiscrete"),
                ("multi_binary", "MultiBinary"),
                ("dict", "Dict"),
                ("tuple", "Tuple"),
            )
        },
        # Stable-Baselines3: policies, feature extractors, buffers, schedules, VecNormalize
        *{
            ("stable_baselines3.common.policies", name)
            for name in (
                "ActorCriticPolicy",
                "ActorCriticCnnPolicy",
                "MultiInputActorCriticPolicy",
            )
        },
        *{
            (f"stable_baselines3.{algorithm.lower()}.policies", name)
            for algorithm in ("SAC", "TD3", "DQN")
            for name in (f"{algorithm}Policy", "CnnPolicy", "MultiInputPolicy")
        },
        *{
            ("sb3_contrib.common.maskable.policies", f"Maskable{name}")
            for name in (
                "ActorCriticPolicy",
                "ActorCriticCnnPolicy",
                "MultiInputActorCriticPolicy",
            )
        },
        *{
            ("sb3_contrib.common.recurrent.policies", f"Recurrent{name}")
            for name in (
                "ActorCriticPolicy",
                "ActorCriticCnnPolicy",
                "MultiInputActorCriticPolicy",
            )
        },
        *{
            ("sb3_contrib.common.recurrent.buffers", name)
            for name in ("RecurrentRolloutBuffer", "RecurrentDictRolloutBuffer")
        },
        *{
            ("sb3_contrib.common.maskable.buffers", name)
            for name in ("MaskableRolloutBuffer", "MaskableDictRolloutBuffer")
        },
        *{
            (f"sb3_contrib.{algorithm.lower()}.policies", name)
            for algorithm in ("QRDQN", "TQC")
            for name in (f"{algorithm}Policy", "CnnPolicy", "MultiInputPolicy")
        },
        *{
            ("stable_baselines3.common.torch_layers", name)
            for name in ("FlattenExtractor", "NatureCNN", "CombinedExtractor")
        },
        *{
            ("stable_baselines3.common.buffers", name)
            for name in ("RolloutBuffer", "DictRolloutBuffer", "ReplayBuffer", "DictReplayBuffer")
        },
        ("stable_baselines3.her.her_replay_buffer", "HerReplayBuffer"),
        ("stable_baselines3.her.goal_selection_strategy", "GoalSelectionStrategy"),
        *{
            ("stable_baselines3.common.type_aliases", name)
            for name in ("TrainFreq", "TrainFrequencyUnit")
        },
        *{
            ("stable_baselines3.common.noise", name)
            for name in (
                "NormalActionNoise",
                "OrnsteinUhlenbeckActionNoise",
                "VectorizedActionNoise",
            )
        },
        *{
            ("stable_baselines3.common.utils", name)
            for name in ("FloatSchedule", "ConstantSchedule", "LinearSchedule")
        },
        ("stable_baselines3.common.sb2_compat.rmsprop_tf_like", "RMSpropTFLike"),
        ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize"),
        ("stable_baselines3.common.running_mean_std", "RunningMeanStd"),
        # torch: the activation and optimiser classes policy_kwargs names
        *{
            ("torch.nn.modules.activation", name)
            for name in (
                "Tanh",
                "ReLU",
                "LeakyReLU",
                "ELU",
                "SELU",
                "GELU",
                "SiLU",
                "Mish",
                "Sigmoid",
                "Softplus",
                "Hardtanh",
            )
        },
        *{
            (f"torch.optim.{name.lower()}", name)
            for name in ("Adam", "AdamW", "RMSprop", "SGD", "Adagrad", "Adamax", "NAdam", "RAdam")
        },
    }
)


class UntrustedPickle(ExportError):
    """A pickle names something a policy checkpoint does not need; nothing of it ran."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name  # "module.name" of the refused global


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise UntrustedPickle(f"it names {module}.{name}", f"{module}.{name}")
        return super().find_class(module, name)


def loads(blob: bytes) -> Any:
    """The object, built only from allowed names; UntrustedPickle names the first other one.

    Other failures (a truncated or corrupt pickle) raise what pickle raises.
    """
    return _Unpickler(io.BytesIO(blob)).load()
