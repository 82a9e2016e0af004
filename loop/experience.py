"""Experience records, stamped with the policy version that made them: a :class:`Step`
(one environment step as a rollout worker saw it) or a :class:`Completion` (one completion
of a language-model policy's group, as a prompt worker got it: ``loop.grpo``).

A :data:`Record` is what a buffer carries. Its encoding is msgpack with arrays as raw
little-endian bytes plus dtype and shape (compact, exact, no JSON for arrays); the same
bytes go to every backend. Every record names its ``stream`` (an episode, a group: the
records a buffer keeps in order), its ``position`` in it, whether it is the ``last``, and
its ``key`` (stream and position) for deduplication: buffers deliver at least once, and a
consumer drops a record it has already seen (:class:`Deduplicator`).

An episode that straddles a version swap keeps each step's own ``model_version``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgpack
import numpy as np

FORMAT = 2  # the encoding's version, first in every step's record (1 is still read)
COMPLETION = "completion"  # first in a completion's record, then its format
COMPLETION_FORMAT = 1


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
    # on an episode's last step: the episode's return (its rewards' sum); None before
    episode_return: float | None = None

    @property
    def key(self) -> str:
        """Unique per step of an episode: the deduplication key."""
        return f"{self.episode_id}:{self.step}"

    @property
    def stream(self) -> str:
        return self.episode_id

    @property
    def position(self) -> int:
        return self.step

    @property
    def last(self) -> bool:
        return self.terminated or self.truncated

    def owned(self) -> Step:
        """The step with arrays of its own, read-only (a worker may reuse its buffers)."""
        return replace(self, observation=_frozen(self.observation), action=_frozen(self.action))

    def packed(self) -> list[Any]:
        return [
            FORMAT,
            str(self.episode_id),
            int(self.step),
            _array(self.observation),
            _array(self.action),
            float(self.log_prob),
            float(self.value),
            float(self.reward),
            bool(self.terminated),
            bool(self.truncated),
            int(self.model_version),
            float(self.served_at),
            None if self.episode_return is None else float(self.episode_return),
        ]


@dataclass(frozen=True, slots=True)
class Completion:
    """One of a group's ``group_size`` completions of one prompt, sampled by the server
    (one generate call with ``n``): the token ids, each completion token's log-prob under
    the version that sampled it (the behaviour policy), and the reward it earned."""

    group_id: str  # the prompt's group: unique per sampled group
    index: int  # 0 .. group_size - 1
    group_size: int
    prompt_ids: np.ndarray  # int32: the prompt's tokens, as the model saw them
    completion_ids: np.ndarray  # int32: the sampled tokens (EOS included when it stopped)
    log_probs: np.ndarray  # float64: each completion token's, under model_version
    reward: float
    finish_reason: str  # stop (EOS or a stop string) or length
    model_version: int  # the version that sampled it (the answer's model_version)
    served_at: float  # Unix seconds: when the server answered

    @property
    def key(self) -> str:
        return f"{self.group_id}:{self.index}"

    @property
    def stream(self) -> str:
        return self.group_id

    @property
    def position(self) -> int:
        return self.index

    @property
    def last(self) -> bool:
        return self.index == self.group_size - 1

    def owned(self) -> Completion:
        return replace(
            self,
            prompt_ids=_frozen(self.prompt_ids),
            completion_ids=_frozen(self.completion_ids),
            log_probs=_frozen(self.log_probs),
        )

    def packed(self) -> list[Any]:
        return [
            COMPLETION,
            COMPLETION_FORMAT,
            str(self.group_id),
            int(self.index),
            int(self.group_size),
            _array(self.prompt_ids),
            _array(self.completion_ids),
            _array(self.log_probs),
            float(self.reward),
            str(self.finish_reason),
            int(self.model_version),
            float(self.served_at),
        ]


Record = Step | Completion


def encode(record: Record) -> bytes:
    """The record's bytes. Numbers may be numpy scalars; arrays must be numeric or bool
    (an object array has no bytes to send: ValueError)."""
    return msgpack.packb(record.packed(), use_bin_type=True)


def decode(data: bytes) -> Record:
    """The record ``encode`` wrote; ValueError for anything else (its arrays are read-only
    views of ``data``)."""
    try:
        fields = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise ValueError(f"not an experience record: {e}") from e
    if isinstance(fields, list) and fields and fields[0] == COMPLETION:
        return _completion(fields)
    if not isinstance(fields, list) or not fields or fields[0] not in _STEP_FORMATS:
        raise ValueError(f"not an experience record of format {FORMAT} (or 1)")
    if fields[0] == 1:  # before episode_return
        fields = [*fields, None]
    if len(fields) != len(_TYPES) or not all(map(_typed, fields, _TYPES)):
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
        episode_return,
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
        episode_return,
    )


_STEP_FORMATS = (1, FORMAT)
_NUMBER_OR_NONE = (float, type(None))
_TYPES: list[type | tuple[type, ...]] = [
    int, str, int, list, list, float, float, float, bool, bool, int, float, _NUMBER_OR_NONE,
]  # fmt: skip
_COMPLETION_TYPES = [str, int, str, int, int, list, list, list, float, str, int, float]


def _typed(value: Any, wanted: type | tuple[type, ...]) -> bool:
    """Exactly of the type (a bool is no int here), or of one of them."""
    return type(value) in wanted if isinstance(wanted, tuple) else type(value) is wanted


def _completion(fields: list[Any]) -> Completion:
    if len(fields) != len(_COMPLETION_TYPES) or [type(f) for f in fields] != _COMPLETION_TYPES:
        raise ValueError(f"not a completion record: fields {fields!r:.200}")
    if fields[1] != COMPLETION_FORMAT:
        raise ValueError(f"not a completion record of format {COMPLETION_FORMAT}")
    (_, _, group_id, index, size, prompt, completion, log_probs, *rest) = fields
    reward, finish_reason, model_version, served_at = rest
    return Completion(
        group_id,
        index,
        size,
        _from_array(prompt, "prompt_ids"),
        _from_array(completion, "completion_ids"),
        _from_array(log_probs, "log_probs"),
        reward,
        finish_reason,
        model_version,
        served_at,
    )


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


def _frozen(values: np.ndarray) -> np.ndarray:
    copy = np.array(values, copy=True)
    copy.flags.writeable = False
    return copy


class Deduplicator:
    """Drops records already seen. Records of a stream arrive in order (every backend keeps
    an episode's or a group's order), so remembering the highest position per stream is
    enough: a record at or below it is a redelivery. Streams are forgotten once ended (a
    terminated or truncated step, a group's last completion), keeping at most
    ``max_episodes`` open ones."""

    def __init__(self, max_episodes: int = 100_000) -> None:
        self.max_episodes = max_episodes
        self._last: dict[str, int] = {}
        self._ended: dict[str, int] = {}  # recently ended episodes: their last step
        self.duplicates = 0

    def fresh(self, record: Record) -> bool:
        """Whether ``record`` is new (and remember it); False for a redelivery."""
        stream = record.stream
        last = self._last.get(stream, self._ended.get(stream, -1))
        if record.position <= last:
            self.duplicates += 1
            return False
        if record.last:
            self._last.pop(stream, None)
            self._ended[stream] = record.position
            if len(self._ended) > self.max_episodes:
                self._ended.pop(next(iter(self._ended)))
        else:
            self._last[stream] = record.position
            if len(self._last) > self.max_episodes:
                self._last.pop(next(iter(self._last)))
        return True
