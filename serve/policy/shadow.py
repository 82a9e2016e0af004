"""A shadow canary's comparison of two versions of a policy on one live batch (issue 45).

The live version served the batch; the canary's version is run on the same graph inputs
(``BatchRecord.inputs``), off the event loop, and its answer is never sent. Both are asked
for their deterministic actions and their distribution's parameters, whatever the batch's
requests asked for, so that every batch compares alike:

- **agreement**: a row agrees when the canary's action is the live one's: exactly, for
  discrete actions (Discrete, MultiDiscrete, MultiBinary); within ``ACTION_ATOL`` in every
  dimension for a Box (the tolerance of ``rlserve rollout verify``'s agreement check);
- **KL(live || canary)** per row of their action distributions (``kernel.distributions``),
  summed: none for a deterministic policy (TD3, DDPG, DQN), which has no distribution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from kernel.spaces import Box
from serve.dataplane.messages import Prepared
from serve.dataplane.model import ServedModel, as_rows
from serve.plugins import Comparison
from serve.policy.version import PolicyVersion
from serve.types import OutputKind, PredictOptions

ACTION_ATOL = 0.05
_ASKED = PredictOptions(deterministic=True, outputs=frozenset({OutputKind.ACTIONS}))
_WITH_DISTRIBUTION = dataclasses.replace(
    _ASKED, outputs=frozenset({OutputKind.ACTIONS, OutputKind.DISTRIBUTION})
)


def compare(
    live: ServedModel, canary: ServedModel, inputs: dict[str, Any], requests: Sequence[Prepared]
) -> Comparison:
    ours, theirs = _policy(live), _policy(canary)
    kind = ours.contract.distribution.kind
    options = _WITH_DISTRIBUTION if kind.stochastic else _ASKED
    asked = [dataclasses.replace(r, options=options, evaluate=None) for r in requests]
    live_out, canary_out = ours.execute(inputs, asked), theirs.execute(inputs, asked)
    rows = len(live_out["actions"])
    agreeing = int(_agreeing(ours, live_out["actions"], canary_out["actions"]).sum())
    if not kind.stochastic:
        return Comparison(rows, agreeing, None)
    divergence = ours.distribution(live_out).kl(theirs.distribution(canary_out))
    return Comparison(rows, agreeing, float(np.sum(divergence)))


def _agreeing(model: PolicyVersion, live: np.ndarray, canary: np.ndarray) -> np.ndarray:
    """Per row: whether the two actions agree."""
    rows = len(live)
    a, b = live.reshape(rows, -1), canary.reshape(rows, -1)
    if isinstance(model.contract.action_space, Box):
        close: np.ndarray = (np.abs(a.astype(np.float64) - b) <= ACTION_ATOL).all(axis=1)
        return close
    same: np.ndarray = (a == b).all(axis=1)
    return same


def _policy(model: ServedModel) -> PolicyVersion:
    """A version of this kind, as what it is (the kind's versions are PolicyVersions)."""
    return cast(PolicyVersion, as_rows(model))
