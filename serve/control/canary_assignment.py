"""A model's canary, as recorded, and which version serves a call while it lasts: whole
episodes, not requests (issue 45). (A shadow canary serves no call: it runs on mirrored
batches, ``serve.control.shadow_mirror``.)

A canary serves ``share`` of a model's episodes on its version, the rest on the live
(active) one. An episode must never mix versions (its return would then say nothing about
either), so a call that names its episode (an episode or client key: a server-held
sequence's id, the ``X-Episode-Key`` header, gRPC metadata, a ``/v2`` parameter, a lane's
key) is assigned by a hash of that key: the same key maps to the same version for as long
as the canary lasts, in every worker process and across restarts, with nothing stored.
The hash is salted with the model, the canary's version and a salt of the canary's own
(so that a canary started again draws a new share of keys), and not with the live
version: a live push during a canary moves the live episodes to the new live version and
leaves every canary episode where it is. A call that names no key is assigned by itself,
at random with the same share, and counted apart (``Assignment.UNKEYED``): its episode
cannot be judged.

The plan is part of the model's serving state (``serve.control.store``), so every worker
follows it (``serve.control.sync``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from serve.config import CanarySettings
from serve.control.return_gate import GateSettings
from serve.types import CanaryMode, GateAction

_SCALE = float(1 << 64)
REMEMBERED_KEYS = 65_536  # a plan's keys and their sides, kept until this many (then anew)


class Assignment(StrEnum):
    """How a call's version was chosen."""

    KEYED = "keyed"  # by its episode key: every call of the episode gets the same version
    UNKEYED = "unkeyed"  # no key: by itself (its episode may mix versions)


class Arm(StrEnum):
    """Which side of a canary a call or an episode is on."""

    LIVE = "live"
    CANARY = "canary"


@dataclass(frozen=True)
class CanaryPlan:
    model: str
    version: int  # the canary's
    share: float  # of episodes on the canary, in (0, 1)
    salt: str = field(default_factory=lambda: secrets.token_hex(8))  # the canary's own
    gate: GateSettings = field(default_factory=GateSettings)
    action: GateAction = GateAction.REPORT
    started_at: float = 0.0  # wall-clock seconds
    mode: CanaryMode = CanaryMode.EPISODES
    # keys seen lately and their side: an episode's calls hash its key once
    _arms: dict[str, Arm] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.share < 1:
            raise ValueError(
                f"share: expected a fraction of episodes strictly between 0 and 1, got {self.share}"
            )
        if self.mode is CanaryMode.SHADOW and self.action is GateAction.AUTO:
            raise ValueError(
                "action: a shadow canary is compared, not judged by return, so nothing acts "
                "on it automatically; use action report (then promote or roll back)"
            )

    @property
    def assigns(self) -> bool:
        """Whether calls are assigned to sides (a shadow canary serves none)."""
        return self.mode is CanaryMode.EPISODES

    def arm_for(self, key: str | None, rng: random.Random) -> tuple[Arm, Assignment]:
        """The side that serves a call naming episode ``key`` (None: no key)."""
        if key is None:
            return _arm(rng.random() < self.share), Assignment.UNKEYED
        arm = self._arms.get(key)
        if arm is None:
            if len(self._arms) >= REMEMBERED_KEYS:
                self._arms.clear()
            arm = self._arms[key] = _arm(self.position(key) < self.share)
        return arm, Assignment.KEYED

    def position(self, key: str) -> float:
        """The key's place in [0, 1): uniform over keys, the same in every process."""
        named = f"{self.model}\0{self.version}\0{self.salt}\0{key}"
        digest = hashlib.blake2b(named.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / _SCALE

    @classmethod
    def of(cls, model: str, settings: CanarySettings, started_at: float) -> CanaryPlan:
        """The plan a canary's settings (an admin call's, a model's config.yaml) make; a
        ValueError names what cannot hold together."""
        gate = GateSettings(
            settings.margin, settings.alpha, settings.min_episodes, settings.planned_episodes
        )
        return cls(model, settings.version, settings.share, gate=gate, action=settings.action,
                   started_at=started_at, mode=settings.mode)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "version": self.version, "share": self.share,
            "salt": self.salt, "gate": dataclasses.asdict(self.gate),
            "action": self.action.value, "started_at": self.started_at,
            "mode": self.mode.value,
        }  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CanaryPlan:
        """A recorded plan (``to_json``); ValueError or TypeError if it is not one."""
        gate = GateSettings(**raw.get("gate", {}))
        return cls(
            str(raw["model"]),
            int(raw["version"]),
            float(raw["share"]),
            str(raw["salt"]),
            gate,
            GateAction(raw.get("action", GateAction.REPORT)),
            float(raw.get("started_at", 0.0)),
            CanaryMode(raw.get("mode", CanaryMode.EPISODES)),
        )


class Judge(StrEnum):
    """Who ended a canary."""

    GATE = "gate"  # its gate, on an ``auto`` canary's first decisive verdict
    ADMIN = "admin"  # a person, through the admin route (``rlserve rollout canary``)


def _arm(on_canary: bool) -> Arm:
    return Arm.CANARY if on_canary else Arm.LIVE
