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


@dataclass(frozen=True, slots=True)
class PredictOptions:
    """How a request wants its rows answered (the request's parameters, validated)."""

    deterministic: bool = True
    seed: int | None = None
    outputs: frozenset[OutputKind] = frozenset({OutputKind.ACTIONS})


Outputs = dict[str, np.ndarray]  # tensors by name, every row of a batch
Answer = dict[str, Any]  # one request's outputs by name (arrays, or a dict of arrays)
