"""Loading a Stable-Baselines3 PPO or A2C checkpoint (.zip) without its environment.

The algorithm is read from the checkpoint's saved settings (PPO has ``clip_range``; A2C has
``n_steps`` but no ``clip_range``), or forced. Checkpoints this exporter cannot serve
faithfully are refused with the reason and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.files import require_file
from serve.contract import Algorithm
from serve.errors import ExportError

_EXPORTABLE = "rlserve exports PPO and A2C actor-critic policies"


@dataclass(frozen=True)
class Sb3Checkpoint:
    path: Path
    algorithm: Algorithm
    model: Any  # stable_baselines3 PPO or A2C
    trained_under_vecnormalize: bool  # the saved data holds _last_original_obs


def load(path: Path, algorithm: Algorithm | None) -> Sb3Checkpoint:
    require_file(path, "checkpoint", "the .zip written by Stable-Baselines3's model.save()")
    data = _saved_data(path)
    _check_policy_class(data.get("policy_class"), path)
    if data.get("use_sde"):
        raise ExportError(
            f"{path}: the policy uses gSDE (use_sde=True), whose noise depends on the "
            "latent features; export a policy trained with use_sde=False"
        )
    chosen = algorithm or _detect_algorithm(data, path)
    return Sb3Checkpoint(
        path=path,
        algorithm=chosen,
        model=_load_model(chosen, path),
        trained_under_vecnormalize=data.get("_last_original_obs") is not None,
    )


def _saved_data(path: Path) -> dict[str, Any]:
    from stable_baselines3.common.save_util import load_from_zip_file

    try:
        data, _, _ = load_from_zip_file(path, device="cpu", print_system_info=False)
    except Exception as exc:  # corrupt zips raise ValueError, zipfile/torch errors and more
        raise ExportError(
            f"{path}: not a readable Stable-Baselines3 checkpoint ({_one_line(exc)}); "
            "give the .zip written by model.save()"
        ) from None
    if not data:
        raise ExportError(
            f"{path}: the zip has no Stable-Baselines3 'data' entry; "
            "give the .zip written by model.save()"
        )
    return dict(data)


def _check_policy_class(policy_class: Any, path: Path) -> None:
    from stable_baselines3.common.policies import ActorCriticPolicy

    if not isinstance(policy_class, type):
        raise ExportError(
            f"{path}: the checkpoint's policy_class could not be restored ({policy_class!r:.80}); "
            "install the package that defines it, then export again"
        )
    recurrent = "Recurrent" in policy_class.__name__
    if not issubclass(policy_class, ActorCriticPolicy) or recurrent:
        raise ExportError(
            f"{path}: unsupported policy class {policy_class.__name__}; {_EXPORTABLE} "
            "(MlpPolicy, CnnPolicy, MultiInputPolicy), not recurrent or off-policy ones"
        )


def _detect_algorithm(data: dict[str, Any], path: Path) -> Algorithm:
    if "clip_range" in data:
        return Algorithm.PPO
    if "n_steps" in data and "gae_lambda" in data:
        return Algorithm.A2C
    raise ExportError(
        f"{path}: cannot tell the algorithm (the checkpoint has neither PPO's clip_range nor "
        f"A2C's n_steps); {_EXPORTABLE}; pass --algorithm ppo or --algorithm a2c if it is one"
    )


def _load_model(algorithm: Algorithm, path: Path) -> Any:
    from stable_baselines3 import A2C, PPO

    classes: dict[Algorithm, Any] = {Algorithm.PPO: PPO, Algorithm.A2C: A2C}
    cls = classes.get(algorithm)
    if cls is None:
        raise ExportError(f"--algorithm {algorithm.value}: not exportable; {_EXPORTABLE}")
    try:
        model = cls.load(path, device="cpu", print_system_info=False)
    except Exception as exc:  # SB3 surfaces pickle, torch and key errors unchanged
        raise ExportError(
            f"{path}: Stable-Baselines3 could not load it as {algorithm.value.upper()} "
            f"({_one_line(exc)}); check --algorithm, or re-save the model with this SB3 version"
        ) from None
    model.policy.set_training_mode(False)
    return model


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__
