"""Everything one server process is made of, built once by ``serve.process.app``."""

from __future__ import annotations

from dataclasses import dataclass

from serve.config import Settings
from serve.control.canary_evidence import CanaryEvidence
from serve.control.episodes import EpisodeBook
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
    episodes: EpisodeBook  # the returns clients reported, by model and version
    canaries: CanaryEvidence  # the evidence on each model's canary, across workers

    def unready_reasons(self) -> list[str]:
        """Why the server is not ready to take traffic ([] when it is): the reasons /ready,
        /v2/health/ready and the gRPC health service all answer with."""
        return not_ready(self.manager, self.phases)


def not_ready(manager: ModelRepositoryManager, phases: ServerPhases) -> list[str]:
    """The models' reasons, after the server's own when it is draining."""
    reasons = manager.unready_reasons()
    if phases.draining:
        reasons.insert(0, f"server is {phases.phase.value}")
    return reasons
