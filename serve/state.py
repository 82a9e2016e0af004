"""What the routes share: one object on ``app.state.rlserve``, built by ``serve.app``."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from serve.config import Settings
from serve.lifecycle import Lifecycle
from serve.metrics import Metrics
from serve.registry import Registry


@dataclass
class ServerState:
    settings: Settings
    registry: Registry
    lifecycle: Lifecycle
    metrics: Metrics


def of(request: Request) -> ServerState:
    state: ServerState = request.app.state.rlserve
    return state
