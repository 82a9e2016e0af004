"""What each side of a model's canary earned, across every worker, and the gate acting on it
(issue 45).

Each worker process counts the episodes reported to it (``serve.control.episodes``) whose
version is one side of the model's canary: the canary's or the live one. Its counts (a
running count, mean and sum of squares per version: ``return_gate.Returns``) are written,
after every report (coalesced), to a small file of its own in the repository, beside the
serving state that every worker follows:

    <repository>/<model>/.canary/<salt>/<host:pid>.json

So any worker can judge the canary on every worker's episodes: it merges the files of the
canary's salt (its own counts from memory) and asks the gate (``return_gate.decide``). A
canary whose plan says ``auto`` is promoted or rolled back by the first worker whose
judgement after a report is decisive; one that says ``report`` is left to a person
(``rlserve rollout canary status``, then ``promote`` or ``rollback``). Another worker's
counts reach the judgement once that worker has written them (after its next report).

A live push during a canary starts the new live version's count from nothing: the gate
compares the canary with the version that is live now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kernel.errors import NotFound, RLServeError
from serve.control import store
from serve.control.canary_assignment import Arm, CanaryPlan, GateAction
from serve.control.episodes import EpisodeReport
from serve.control.manager import ModelRepositoryManager
from serve.control.return_gate import Decision, Returns, Verdict, decide
from serve.control.updates import Updater
from serve.metrics import Metrics

log = logging.getLogger("rlserve.canary")

FOLDER = ".canary"
_VERDICT_VALUE = {Verdict.PROMOTE: 1, Verdict.CONTINUE: 0, Verdict.ROLLBACK: -1}


@dataclass(frozen=True)
class CanaryStatus:
    """A model's canary now: its plan, each side's returns on every worker, the verdict."""

    plan: CanaryPlan
    live_version: int
    live: Returns
    canary: Returns
    decision: Decision
    workers: int  # whose counts were merged

    def to_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "model": self.plan.model,
            "canary": self.plan.to_json(),
            "versions": [
                _side(Arm.LIVE, self.live_version, self.live),
                _side(Arm.CANARY, self.plan.version, self.canary),
            ],
            "difference": d.difference if self.live.count and self.canary.count else None,
            "interval": [_finite(d.lower), _finite(d.upper)],
            "verdict": d.verdict.value,
            "reason": d.reason,
            "workers": self.workers,
        }


class CanaryReturns:
    """This worker's counts of each model's canary, written for the others, and judged."""

    def __init__(self, manager: ModelRepositoryManager, updater: Updater, metrics: Metrics) -> None:
        self.manager = manager
        self.updater = updater
        self.metrics = metrics
        self._counts: dict[tuple[str, str], dict[int, Returns]] = {}  # (model, salt) -> version
        self._dirty: set[str] = set()  # models whose counts changed since written
        self._writing: asyncio.Task[None] | None = None

    def reported(self, model: str, report: EpisodeReport) -> None:
        """Count an episode toward the model's canary, if its version is one of its sides."""
        lifecycle = self.manager.lifecycle(model)
        plan = lifecycle.canary
        if plan is None or report.version not in (plan.version, lifecycle.active):
            return
        counts = self._counts.setdefault((model, plan.salt), {})
        counts[report.version] = counts.get(report.version, Returns()).add(report.value)
        self._dirty.add(model)
        if self._writing is None or self._writing.done():
            self._writing = asyncio.get_running_loop().create_task(self._write_and_judge())

    async def status(self, model: str) -> CanaryStatus:
        """The model's canary judged on every worker's counts; NotFound without a canary."""
        lifecycle = self.manager.lifecycle(model)
        plan, live = lifecycle.canary, lifecycle.active
        if plan is None or live is None:
            raise NotFound(
                f"model {model!r} has no canary running; start one with POST "
                f"/v1/models/{model}/canary (rlserve rollout canary start)"
            )
        own = dict(self._counts.get((model, plan.salt), {}))
        others = await asyncio.to_thread(_read_others, self._folder(plan))
        merged = own
        for counts in others:
            for version, returns in counts.items():
                merged[version] = merged.get(version, Returns()).merged(returns)
        on_live, on_canary = merged.get(live, Returns()), merged.get(plan.version, Returns())
        decision = decide(on_live, on_canary, plan.gate)
        bounds = (decision.lower, decision.difference, decision.upper)
        self.metrics.canary_judged(model, _VERDICT_VALUE[decision.verdict], bounds)
        return CanaryStatus(plan, live, on_live, on_canary, decision, 1 + len(others))

    async def _write_and_judge(self) -> None:
        """Write the changed models' counts, then let the gate act on an ``auto`` canary."""
        while self._dirty:
            model = self._dirty.pop()
            try:
                await self._write(model)
                await self._judge(model)
            except RLServeError as exc:
                log.warning("model %s: canary counts not judged: %s", model, exc.message)
            except Exception:
                log.exception("model %s: writing or judging the canary's counts failed", model)

    async def _write(self, model: str) -> None:
        plan = self.manager.lifecycle(model).canary
        if plan is None:
            return
        counts = self._counts.get((model, plan.salt), {})
        body = orjson.dumps({str(v): dataclasses.asdict(r) for v, r in counts.items()})
        folder = self._folder(plan)
        await asyncio.to_thread(_write_own, folder, body)

    async def _judge(self, model: str) -> None:
        plan = self.manager.lifecycle(model).canary
        if plan is None or plan.action is not GateAction.AUTO:
            return
        status = await self.status(model)
        verdict = status.decision.verdict
        if verdict is Verdict.CONTINUE:
            return
        try:
            await self.updater.end_canary(model, verdict, plan.salt)
        except NotFound:
            return  # ended meanwhile (another worker's gate, or a person)
        self.metrics.canary_verdicts.labels(model, verdict.value, "gate").inc()
        log.info(
            "model %s: the gate ended canary version %d: %s after %d live and %d canary "
            "episodes (%s)",
            model, plan.version, verdict.value, status.live.count, status.canary.count,
            status.decision.reason,
        )  # fmt: skip

    def _folder(self, plan: CanaryPlan) -> Path:
        return self.manager.settings.model_repository / plan.model / FOLDER / plan.salt


def _own_file(folder: Path) -> Path:
    return folder / f"{store.worker_id()}.json"


def _write_own(folder: Path, body: bytes) -> None:
    with store.writing_to(folder):
        folder.mkdir(parents=True, exist_ok=True)
        store.write_atomic(_own_file(folder), body, durable=False)


def _read_others(folder: Path) -> list[dict[int, Returns]]:
    """Every other worker's counts in ``folder`` (unreadable files are skipped: a worker
    may be writing its own)."""
    own = _own_file(folder).name
    found = []
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json") and n != own]
    except OSError:
        return []
    for name in names:
        try:
            raw = orjson.loads((folder / name).read_bytes())
            found.append({int(v): Returns(**r) for v, r in raw.items()})
        except (OSError, ValueError, TypeError):
            continue
    return found


def _side(arm: Arm, version: int, returns: Returns) -> dict[str, Any]:
    return {
        "arm": arm.value,
        "version": version,
        "episodes": returns.count,
        "mean_return": returns.mean if returns.count else None,
        "return_stddev": math.sqrt(returns.variance) if returns.count > 1 else None,
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
