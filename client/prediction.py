"""What a client gets back: a prediction, or the error the server answered with.

Shared by the HTTP client (``client.policy``) and the local lane's (``client.lane``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RequestFailed(Exception):
    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.retry_after_s = (
            status,
            code,
            message,
            retry_after_s,
        )


@dataclass(frozen=True)
class Prediction:
    model: str
    model_version: int
    model_sha256: str
    actions: Any = None
    log_probs: Any = None
    values: Any = None
    distribution: Any = None
    q_values: Any = None  # a Q-network's value of each action (DQN)
    state: Any = None  # a recurrent policy's memory after this step: send it with the next
