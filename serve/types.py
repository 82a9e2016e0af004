"""Small types shared across the server's modules."""

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
    DISTRIBUTION = "distribution"


class ModelState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class PredictOptions:
    deterministic: bool = True
    seed: int | None = None
    outputs: frozenset[OutputKind] = frozenset({OutputKind.ACTIONS})


@dataclass(frozen=True)
class Prepared:
    """A validated request, ready to join a batch: its rows and how to answer it."""

    feeds: dict[str, np.ndarray]  # graph input name -> [rows, ...]
    rows: int
    single: bool  # one observation, not a list: answer without the batch axis
    options: PredictOptions
    evaluate: np.ndarray | None = None  # given actions to score instead of choosing them


Answer = dict[str, Any]  # the JSON-ready result of one request
Outputs = dict[str, np.ndarray]  # a graph's outputs by tensor name, for every row of a batch
