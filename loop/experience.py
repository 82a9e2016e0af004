"""Experience records: one environment step as a rollout worker saw it, stamped with the
policy version that chose its action.

A :class:`Step` is what a buffer carries. Its encoding is msgpack with arrays as raw
little-endian bytes plus dtype and shape (compact, exact, no JSON for arrays); the same
bytes go to every backend. ``key`` (episode and step) identifies a step for deduplication:
buffers deliver at least once, and a consumer drops a step it has already seen
(:class:`Deduplicator`).

An episode that straddles a version swap keeps each step's own ``model_version``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

FORMAT = 1  # the encoding's version, first in every record


@dataclass(frozen=True, slots=True)
class Step:
    episode_id: str
    step: int  # 0 for the first step of the episode
    observation: np.ndarray  # what the policy saw
    action: np.ndarray  # what the environment was given
    log_prob: float  # of the action, under model_version
    value: float  # the critic's estimate for the observation
    reward: float
    terminated: bool
    truncated: bool
    model_version: int  # the version that chose the action (X-Policy-Version)
    served_at: float  # Unix seconds: when the server answered

    @property
    def key(self) -> str:
        """Unique per step of an episode: the deduplication key."""
        return f"{self.episode_id}:{self.step}"


def encode(step: Step) -> bytes:
    """The record's bytes. Numbers may be numpy scalars; arrays must be numeric or bool
    (an object array has no bytes to send: ValueError)."""
    return msgpack.packb(
        [
            FORMAT,
            str(step.episode_id),
            int(step.step),
            _array(step.observation),
            _array(step.action),
            float(step.log_prob),
            float(step.value),
            float(step.reward),
            bool(step.terminated),
            bool(step.truncated),
            int(step.model_version),
            float(step.served_at),
        ],
        use_bin_type=True,
    )


def decode(data: bytes) -> Step:
    """The step ``encode`` wrote; ValueError for anything else (its arrays are read-only
    views of ``data``)."""
    try:
        fields = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise ValueError(f"not an experience record: {e}") from e
    if not isinstance(fields, list) or not fields or fields[0] != FORMAT:
        raise ValueError(f"not an experience record of format {FORMAT}")
    if len(fields) != 12 or [type(f) for f in fields] != _TYPES:
        raise ValueError(f"not an experience record: fields {fields!r:.200}")
    (
        _,
        episode_id,
        step,
        observation,
        action,
        log_prob,
        value,
        reward,
        terminated,
        truncated,
        model_version,
        served_at,
    ) = fields
    return Step(
        episode_id,
        step,
        _from_array(observation, "observation"),
        _from_array(action, "action"),
        log_prob,
        value,
        reward,
        terminated,
        truncated,
        model_version,
        served_at,
    )


_TYPES = [int, str, int, list, list, float, float, float, bool, bool, int, float]
_KINDS = "biufc"  # bool, integers, floats, complex: arrays that are their bytes


def _array(values: np.ndarray) -> list[Any]:
    array = np.asarray(values)
    if array.dtype.kind not in _KINDS:
        raise ValueError(
            f"cannot encode an array of dtype {array.dtype}: use a numeric or bool array"
        )
    little = array.dtype.newbyteorder("<")
    return [little.str, list(array.shape), np.ascontiguousarray(array, dtype=little).tobytes()]


def _from_array(packed: list[Any], name: str) -> np.ndarray:
    try:
        dtype, shape, raw = packed
        kind = np.dtype(dtype)
        if kind.kind not in _KINDS or not isinstance(raw, bytes):
            raise ValueError(f"dtype {dtype!r}")
        return np.frombuffer(raw, dtype=kind).reshape(shape)
    except (TypeError, ValueError) as e:
        raise ValueError(f"not an experience record: bad {name} array: {e}") from e


class Deduplicator:
    """Drops steps already seen. Steps of an episode arrive in order (every backend keeps
    an episode's order), so remembering the highest step per episode is enough: a step at
    or below it is a redelivery. Episodes are forgotten once ended (terminated or
    truncated), keeping at most ``max_episodes`` open ones."""

    def __init__(self, max_episodes: int = 100_000) -> None:
        self.max_episodes = max_episodes
        self._last: dict[str, int] = {}
        self._ended: dict[str, int] = {}  # recently ended episodes: their last step
        self.duplicates = 0

    def fresh(self, step: Step) -> bool:
        """Whether ``step`` is new (and remember it); False for a redelivery."""
        last = self._last.get(step.episode_id, self._ended.get(step.episode_id, -1))
        if step.step <= last:
            self.duplicates += 1
            return False
        if step.terminated or step.truncated:
            self._last.pop(step.episode_id, None)
            self._ended[step.episode_id] = step.step
            if len(self._ended) > self.max_episodes:
                self._ended.pop(next(iter(self._ended)))
        else:
            self._last[step.episode_id] = step.step
            if len(self._last) > self.max_episodes:
                self._last.pop(next(iter(self._last)))
        return True
