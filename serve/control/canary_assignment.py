"""Which version serves a call while a model has a canary: whole episodes, not requests
(issue 45).

A canary serves ``share`` of a model's episodes on its version, the rest on the live one.
An episode must never mix versions (its return would then say nothing about either), so a
call that names its episode (an episode or client key: a server-held sequence's id, a
header, a field) is assigned by a hash of that key: the same key maps to the same version
for as long as the canary lasts, in every worker process and across restarts, with nothing
stored. The hash is salted with the model, both versions and a salt of the canary's own,
so that a new canary draws a new share of keys. A call that names no key is assigned by
itself, at random with the same share, and counted apart (``Assignment.UNKEYED``): its
episode cannot be judged.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from enum import Enum

_SCALE = float(1 << 64)


class Assignment(Enum):
    """How a call's version was chosen."""

    KEYED = "keyed"  # by its episode key: every call of the episode gets the same version
    UNKEYED = "unkeyed"  # no key: by itself (its episode may mix versions)


@dataclass(frozen=True)
class CanaryPlan:
    model: str
    live_version: int
    canary_version: int
    share: float  # of episodes on the canary, in (0, 1)
    salt: str = ""  # the canary's own: a canary started again draws another share of keys

    def __post_init__(self) -> None:
        if not 0 < self.share < 1:
            raise ValueError(
                f"share: expected a fraction strictly between 0 and 1, got {self.share}"
            )
        if self.live_version == self.canary_version:
            raise ValueError(
                f"canary_version: the live version is {self.live_version} already; a canary "
                "needs another version"
            )

    def version_for(self, key: str | None, rng: random.Random) -> tuple[int, Assignment]:
        """The version that serves a call naming episode ``key`` (None: no key)."""
        if key is None:
            on_canary = rng.random() < self.share
            return self._version(on_canary), Assignment.UNKEYED
        return self._version(self.position(key) < self.share), Assignment.KEYED

    def position(self, key: str) -> float:
        """The key's place in [0, 1): uniform over keys, the same in every process."""
        named = f"{self.model}\0{self.live_version}\0{self.canary_version}\0{self.salt}\0{key}"
        digest = hashlib.blake2b(named.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / _SCALE

    def _version(self, on_canary: bool) -> int:
        return self.canary_version if on_canary else self.live_version
