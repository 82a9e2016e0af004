"""What the routes share: one object on ``app.state.rlserve``, built by ``serve.process.app``."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from serve.config import Settings
from serve.control.manager import Registry
from serve.control.updates import Updater
from serve.metrics import Metrics
from serve.process.phases import Lifecycle


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
