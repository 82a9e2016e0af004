"""What the routes share: one object on ``app.state.rlserve``, built by ``serve.app``."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from serve.config import Settings
from serve.lifecycle import Lifecycle
from serve.metrics import Metrics
from serve.registry import Registry
from serve.updates import Updater


@dataclass
class ServerState:
    settings: Settings
    registry: Registry
    lifecycle: Lifecycle
    metrics: Metrics
    updater: Updater


def of(request: Request) -> ServerState:
    state: ServerState = request.app.state.rlserve
    return state
