"""Observation and action spaces for a torch module: from a gymnasium id, or given as JSON.

The JSON form is the policy contract's (see :mod:`kernel.spaces`), e.g.
``{"type": "Box", "shape": [4], "low": -1, "high": 1}`` or ``{"type": "Discrete", "n": 2}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from export.errors import ExportError
from kernel.errors import InvalidInput
from kernel.spaces import Dict, Leaf, Space, from_gymnasium


@dataclass(frozen=True)
class Spaces:
    observation: Leaf | Dict
    action: Leaf | Dict


def resolve(env_id: str | None, observation_json: str | None, action_json: str | None) -> Spaces:
    given_json = observation_json is not None or action_json is not None
    if env_id is not None and given_json:
        raise ExportError(
            "--env and --observation-space/--action-space both given; give one of the two forms"
        )
    if env_id is not None:
        return from_env(env_id)
    if observation_json is None or action_json is None:
        raise ExportError(
            "spaces unknown: give --env GYM_ID, or both --observation-space JSON and "
            "--action-space JSON"
        )
    return Spaces(
        observation=parse(observation_json, "--observation-space"),
        action=parse(action_json, "--action-space"),
    )


def from_env(env_id: str) -> Spaces:
    import gymnasium

    try:
        env = gymnasium.make(env_id)
    except Exception as exc:  # gymnasium raises its own errors, and the env's constructor any
        raise ExportError(f"--env {env_id}: gymnasium.make failed ({_one_line(exc)})") from None
    try:
        return Spaces(
            _described(env.observation_space, "observation"), _described(env.action_space, "action")
        )
    finally:
        env.close()


def parse(text: str, flag: str) -> Leaf | Dict:
    try:
        parsed: Leaf | Dict = TypeAdapter(Space).validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the value"
        raise ExportError(
            f"{flag}: invalid space at {where}: {first['msg']}; e.g. "
            '\'{"type": "Box", "shape": [4]}\' or \'{"type": "Discrete", "n": 2}\''
        ) from None
    return parsed


def _described(space: Any, which: str) -> Leaf | Dict:
    try:
        return from_gymnasium(space)
    except InvalidInput as exc:
        raise ExportError(f"{which} space: {exc.message}") from None


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
