"""Loading a Stable-Baselines3 checkpoint (.zip) without its environment.

The policy class says the family (an actor-critic, SAC's, TD3's or DQN's policy); the
algorithm within it is read from the checkpoint's saved settings (PPO has ``clip_range``,
A2C ``n_steps`` but no ``clip_range``; DDPG is TD3 with ``policy_delay=1`` and no target
noise clip), or forced. Checkpoints this exporter cannot serve faithfully are refused with
the reason and the fix.

Nothing in the checkpoint runs: the zip is size-checked (:mod:`export.sb3.archive`), its
pickled settings are read by :mod:`export.sb3.pickles` and handed to Stable-Baselines3 as
``custom_objects``, and its state dicts are read with ``torch.load(weights_only=True)``.
``trust_checkpoint`` lets Stable-Baselines3's own unpickling restore the settings instead.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from export.errors import ExportError
from export.files import require_file
from export.sb3 import archive, pickles
from kernel.contract import Algorithm
from kernel.errors import one_line

_EXPORTABLE = (
    "rlserve exports Stable-Baselines3's PPO, A2C, SAC, TD3, DDPG and DQN policies and "
    "sb3-contrib's QR-DQN, TQC, MaskablePPO and RecurrentPPO"
)
_PICKLED = ":serialized:"  # how model.save() marks a cloudpickled setting in its JSON
_POLICY_CLASS = "policy_class"


class PolicyFamily(StrEnum):
    """The kind of network a policy class is, and so how it is exported."""

    ACTOR_CRITIC = "actor-critic"  # PPO, A2C: a distribution and a state value
    MASKABLE = "maskable actor-critic"  # MaskablePPO (sb3-contrib): the same, under masks
    RECURRENT = "recurrent actor-critic"  # RecurrentPPO (sb3-contrib): the same, with LSTMs
    SAC = "SAC"  # a squashed Gaussian actor and Q-critics
    TD3 = "TD3"  # TD3 and DDPG: a deterministic actor and Q-critics
    DQN = "DQN"  # a Q-network, acting greedily
    QRDQN = "QR-DQN"  # a quantile Q-network (sb3-contrib), acting greedily on the means
    TQC = "TQC"  # SAC's actor and quantile critics (sb3-contrib)

    @property
    def algorithms(self) -> tuple[Algorithm, ...]:
        return _ALGORITHMS[self]


_ALGORITHMS = {
    PolicyFamily.ACTOR_CRITIC: (Algorithm.PPO, Algorithm.A2C),
    PolicyFamily.MASKABLE: (Algorithm.MASKABLE_PPO,),
    PolicyFamily.RECURRENT: (Algorithm.RECURRENT_PPO,),
    PolicyFamily.SAC: (Algorithm.SAC,),
    PolicyFamily.TD3: (Algorithm.TD3, Algorithm.DDPG),
    PolicyFamily.DQN: (Algorithm.DQN,),
    PolicyFamily.QRDQN: (Algorithm.QRDQN,),
    PolicyFamily.TQC: (Algorithm.TQC,),
}


@dataclass(frozen=True)
class Sb3Checkpoint:
    path: Path
    algorithm: Algorithm
    family: PolicyFamily
    model: Any  # the stable_baselines3 model (PPO, A2C, SAC, TD3, DDPG or DQN)
    trained_under_vecnormalize: bool  # known only for actor-critics (see below)


def load(path: Path, algorithm: Algorithm | None, *, trust_checkpoint: bool) -> Sb3Checkpoint:
    """The checkpoint's model; without ``trust_checkpoint`` no pickle in it runs code."""
    require_file(path, "checkpoint", "the .zip written by Stable-Baselines3's model.save()")
    with path.open("rb") as file:
        raw = archive.settings(file, path)
        restored = _restored(raw, path, trust_checkpoint=trust_checkpoint)
        data = {**raw, **restored}
        family = _family(data.get("policy_class"), path)
        if data.get("use_sde"):
            raise ExportError(
                f"{path}: the policy uses gSDE (use_sde=True), whose noise depends on the "
                "latent features; export a policy trained with use_sde=False"
            )
        chosen = _chosen(algorithm, family, data, path)
        file.seek(0)
        model = _load_model(chosen, file, path, restored)
    return Sb3Checkpoint(
        path=path,
        algorithm=chosen,
        family=family,
        model=model,
        trained_under_vecnormalize=_trained_under_vecnormalize(data, family),
    )


def _trained_under_vecnormalize(data: dict[str, Any], family: PolicyFamily) -> bool:
    """On-policy algorithms keep ``_last_original_obs`` only under VecNormalize. Off-policy
    ones keep it either way (without VecNormalize it is the observation before
    ``_last_obs``), so their checkpoints do not say: for them this is False, and
    ``--vecnormalize`` is the user's to give (docs/export.md says so)."""
    on_policy = family in (PolicyFamily.ACTOR_CRITIC, PolicyFamily.MASKABLE, PolicyFamily.RECURRENT)
    return on_policy and data.get("_last_original_obs") is not None


def _restored(raw: dict[str, Any], path: Path, *, trust_checkpoint: bool) -> dict[str, Any]:
    """The settings ``model.save()`` pickled, unpickled: by :mod:`export.sb3.pickles`, or,
    trusted, as Stable-Baselines3 does (a setting it cannot restore is left out, as it does).
    The policy class comes first, so that an unsupported one is named as such.
    """
    pickled = {key: value for key, value in raw.items() if _is_pickled(value)}
    if trust_checkpoint:
        from stable_baselines3.common.save_util import json_to_data

        return json_to_data(json.dumps(pickled))
    keys = sorted(pickled, key=lambda key: key != _POLICY_CLASS)
    return {key: _unpickled(key, pickled[key][_PICKLED], path) for key in keys}


def _is_pickled(value: Any) -> bool:
    return isinstance(value, dict) and _PICKLED in value


def _unpickled(key: str, encoded: Any, path: Path) -> Any:
    try:
        return pickles.loads(base64.b64decode(str(encoded).encode("ascii"), validate=True))
    except pickles.UntrustedPickle as refused:
        raise ExportError(_refusal(key, refused.name, path)) from None
    except Exception as exc:  # pickle raises anything for a corrupt stream
        raise ExportError(
            f"{path}: data[{key!r}] is not a readable pickle ({type(exc).__name__}: "
            f"{one_line(exc, 160)}); give the .zip written by model.save()"
        ) from None


def _refusal(key: str, name: str, path: Path) -> str:
    trust = (
        "unpickling it could run any code, so it was not unpickled and nothing in it ran. "
        "Export only checkpoints you trust: if you know where this file comes from (you or "
        "your team saved it{why}), pass --trust-checkpoint to load it as Stable-Baselines3 "
        "does"
    )
    if key == _POLICY_CLASS:
        short = name.rsplit(".", 1)[-1]
        return (
            f"{path}: unsupported policy class {short}; {_EXPORTABLE} (their MlpPolicy, "
            f"CnnPolicy and MultiInputPolicy, and the Lstm ones). data['policy_class'] "
            f"names {name}; "
            + trust.format(why=", and it is your own subclass of one of SB3's policies")
        )
    return (
        f"{path}: data[{key!r}] is a pickle that names {name}, which a Stable-Baselines3 "
        "policy checkpoint does not need; "
        + trust.format(
            why=", e.g. with a custom class, or an SB3 older than 2.6 whose "
            "schedules are pickled functions"
        )
    )


def _family(policy_class: Any, path: Path) -> PolicyFamily:
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.dqn.policies import DQNPolicy
    from stable_baselines3.sac.policies import SACPolicy
    from stable_baselines3.td3.policies import TD3Policy

    if not isinstance(policy_class, type):
        raise ExportError(
            f"{path}: the checkpoint's policy_class could not be restored ({policy_class!r:.80}); "
            "install the package that defines it, then export again"
        )
    bases = [  # sb3-contrib's first: its recurrent policies are SB3 actor-critics too
        *_contrib_bases(),
        (ActorCriticPolicy, PolicyFamily.ACTOR_CRITIC),
        (SACPolicy, PolicyFamily.SAC),
        (TD3Policy, PolicyFamily.TD3),
        (DQNPolicy, PolicyFamily.DQN),
    ]
    for base, family in bases:
        if issubclass(policy_class, base):
            return family
    raise ExportError(
        f"{path}: unsupported policy class {policy_class.__name__}; {_EXPORTABLE} "
        "(their MlpPolicy, CnnPolicy and MultiInputPolicy, and the Lstm ones)"
    )


def _contrib_bases() -> list[tuple[type, PolicyFamily]]:
    """sb3-contrib's policy classes, when it is installed (the export extra installs it)."""
    try:
        from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
        from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
        from sb3_contrib.qrdqn.policies import QRDQNPolicy
        from sb3_contrib.tqc.policies import TQCPolicy
    except ImportError:
        return []
    return [
        (MaskableActorCriticPolicy, PolicyFamily.MASKABLE),
        (RecurrentActorCriticPolicy, PolicyFamily.RECURRENT),
        (QRDQNPolicy, PolicyFamily.QRDQN),
        (TQCPolicy, PolicyFamily.TQC),
    ]


def _chosen(
    forced: Algorithm | None, family: PolicyFamily, data: dict[str, Any], path: Path
) -> Algorithm:
    if forced is None:
        return _detect_algorithm(family, data, path)
    if forced not in family.algorithms:
        allowed = " or ".join(f"--algorithm {a.value}" for a in family.algorithms)
        raise ExportError(
            f"--algorithm {forced.value}: the checkpoint holds a {family.value} policy "
            f"({data[_POLICY_CLASS].__name__}), which {forced.value.upper()} does not train; "
            f"give {allowed}, or leave --algorithm out to read it from the checkpoint"
        )
    return forced


def _detect_algorithm(family: PolicyFamily, data: dict[str, Any], path: Path) -> Algorithm:
    if family is PolicyFamily.TD3:
        ddpg = data.get("policy_delay") == 1 and data.get("target_noise_clip") == 0.0
        return Algorithm.DDPG if ddpg else Algorithm.TD3
    if family is not PolicyFamily.ACTOR_CRITIC:  # one algorithm each
        return family.algorithms[0]
    if "clip_range" in data:
        return Algorithm.PPO
    if "n_steps" in data and "gae_lambda" in data:
        return Algorithm.A2C
    raise ExportError(
        f"{path}: cannot tell the algorithm (the checkpoint has neither PPO's clip_range nor "
        f"A2C's n_steps); pass --algorithm ppo or --algorithm a2c if it is one"
    )


def _load_model(algorithm: Algorithm, file: IO[bytes], path: Path, restored: dict[str, Any]) -> Any:
    """The model from the open checkpoint; ``restored`` stands in for every pickled setting,
    so Stable-Baselines3 unpickles none of them itself (its state dicts are read with
    ``torch.load(weights_only=True)``)."""
    cls = _algorithm_class(algorithm)
    if cls is None:
        raise ExportError(f"--algorithm {algorithm.value}: not exportable; {_EXPORTABLE}")
    try:
        custom = {**restored, **_without_her(restored)}
        model = cls.load(file, device="cpu", custom_objects=custom, print_system_info=False)
    except Exception as exc:  # SB3 surfaces pickle, torch and key errors unchanged
        raise ExportError(
            f"{path}: Stable-Baselines3 could not load it as {algorithm.value.upper()} "
            f"({one_line(exc, 200) or type(exc).__name__}); check --algorithm, or re-save the "
            "model with this SB3 version"
        ) from None
    model.policy.set_training_mode(False)
    return model


def _without_her(restored: dict[str, Any]) -> dict[str, Any]:
    """A HER replay buffer needs its environment to be built, and the policy does not need
    it: such a checkpoint loads with SB3's default buffer instead (the weights are the same;
    the goal-conditioned Dict observations are served as any Dict space)."""
    buffer = restored.get("replay_buffer_class")
    if getattr(buffer, "__name__", None) != "HerReplayBuffer":
        return {}
    return {"replay_buffer_class": None, "replay_buffer_kwargs": {}}


def _algorithm_class(algorithm: Algorithm) -> Any:
    import stable_baselines3

    name = algorithm.value.upper()
    contrib = {
        Algorithm.QRDQN: "QRDQN",
        Algorithm.TQC: "TQC",
        Algorithm.MASKABLE_PPO: "MaskablePPO",
        Algorithm.RECURRENT_PPO: "RecurrentPPO",
    }
    if algorithm in contrib:
        import sb3_contrib

        return getattr(sb3_contrib, contrib[algorithm])
    return getattr(stable_baselines3, name, None)
