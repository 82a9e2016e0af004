"""The policy kind as a plug-in (``ModelKind.ROWS``): every exported policy whose requests
are rows of one forward pass, whatever algorithm trained it (PPO, A2C, DQN, QR-DQN, SAC,
TD3, DDPG, recurrent and masked variants). Its contract's kind stays ``actor_critic``.

Its versions are served by the dynamic batch scheduler, answered by the shared transports
(predict, the Open Inference Protocol, the lane), and reported through the batch records'
metrics sink; a model may hold recurrent sequences and a features view.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serve.batching.dynamic_batcher import DynamicBatchScheduler
from serve.batching.sequences import SequenceTable
from serve.config import ModelSettings
from serve.dataplane.kinds import ModelKind
from serve.dataplane.scheduler import Scheduler
from serve.metrics import Metrics
from serve.plugins import Claim, FrontendParts, KindPlugin, KindRoutes, SchedulerParts
from serve.policy import loading, shadow, updates


def _claims(folder: Path | None) -> Claim:
    return Claim.FALLBACK  # any model file is a policy unless another kind claims it


def _scheduler(parts: SchedulerParts) -> Scheduler:
    sinks = (parts.metrics.sink, *parts.sinks)
    return DynamicBatchScheduler(parts.name, parts.versions, parts.settings, sinks)


def _sequences(name: str, settings: ModelSettings) -> SequenceTable:
    return SequenceTable(
        name,
        settings.max_held_sequences,
        settings.sequence_idle_timeout_s,
        settings.max_sequences_per_owner,
    )


def _metrics(metrics: Metrics) -> Any:
    return metrics.sink  # the batch records' sink: rows, batches, latency by version


def _frontends(parts: FrontendParts) -> KindRoutes:
    return KindRoutes()  # the shared transports answer policies


PLUGIN = KindPlugin(
    kind=ModelKind.ROWS,
    contract_kind="actor_critic",
    claims=_claims,
    load=loading.load,
    scheduler=_scheduler,
    check_update=updates.check_update,
    compare=shadow.compare,
    default_deadline_ms=lambda settings: settings.default_deadline_ms,
    sequences=_sequences,
    metrics=_metrics,
    frontends=_frontends,
)
