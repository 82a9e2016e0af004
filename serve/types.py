"""Small types shared across rlserve's layers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np


class OutputKind(StrEnum):
    """What a predict request may ask to receive."""

    ACTIONS = "actions"
    LOG_PROBS = "log_probs"
    VALUES = "values"
    Q_VALUES = "q_values"
    DISTRIBUTION = "distribution"


class CanaryMode(StrEnum):
    """What a model's canary version does (``serve.control.canary_assignment``)."""

    EPISODES = "episodes"  # serves its share of episodes; judged by their returns
    SHADOW = "shadow"  # serves nothing: runs on its share of the live batches, compared


class GateAction(StrEnum):
    """What a canary gate's verdict does."""

    AUTO = "auto"  # promote or roll back as soon as the gate decides
    REPORT = "report"  # say so (``rlserve rollout canary status``); a person acts


@dataclass(frozen=True, slots=True)
class PredictOptions:
    """How a request wants its rows answered (the request's parameters, validated)."""

    deterministic: bool = True
    seed: int | None = None
    outputs: frozenset[OutputKind] = frozenset({OutputKind.ACTIONS})


Outputs = dict[str, np.ndarray]  # tensors by name, every row of a batch
Answer = dict[str, Any]  # one request's outputs by name (arrays, or a dict of arrays)
