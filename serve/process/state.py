"""Everything one server process is made of, built once by ``serve.process.app``."""

from __future__ import annotations

from dataclasses import dataclass

from serve.config import Settings
from serve.control.manager import ModelRepositoryManager
from serve.control.updates import Updater
from serve.metrics import Metrics
from serve.process.phases import ServerPhases


@dataclass
class ServerState:
    settings: Settings
    manager: ModelRepositoryManager
    phases: ServerPhases
    metrics: Metrics
    updater: Updater
