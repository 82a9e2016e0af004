"""The evidence on a model's canary, across every worker, and the gate acting on it
(issue 45).

A canary that serves episodes is judged by their returns: each worker process counts the
episodes reported to it (``serve.control.episodes``) whose version is one side of the
canary (the canary's or the live one), as a running count, mean and sum of squares per
version (``return_gate.Returns``). A shadow canary is judged by how it compares with the
live version on mirrored batches (``serve.control.shadow_mirror``): rows compared, rows
whose actions agreed, and the sum of KL(live || canary). Each worker writes its evidence,
after every change (coalesced), to a small file of its own in the repository, beside the
serving state that every worker follows:

    <repository>/<model>/.canary/<salt>/<host:pid>.json

So any worker can judge the canary on every worker's evidence: it merges the files of the
canary's salt (its own counts from memory). An episodes canary is asked of the gate
(``return_gate.decide``); one whose plan says ``auto`` is promoted or rolled back by the
first worker whose judgement after a report is decisive; one that says ``report`` is left
to a person (``rlserve rollout canary status``, then ``promote`` or ``rollback``). A shadow
canary is only reported: agreement and KL say how different the canary acts, not whether it
earns more. Another worker's counts reach the judgement once that worker has written them.

A live push during a canary starts the new live version's count from nothing: the gate
compares the canary with the version that is live now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kernel.errors import NotFound, RLServeError
from serve.control import store
from serve.control.canary_assignment import Arm, CanaryPlan, Judge
from serve.control.episodes import EpisodeReport
from serve.control.manager import ModelRepositoryManager
from serve.control.return_gate import Decision, Returns, Verdict, decide
from serve.control.updates import Updater
from serve.metrics import Metrics
from serve.plugins import Comparison
from serve.types import CanaryMode, GateAction

log = logging.getLogger("rlserve.canary")

FOLDER = ".canary"
_VERDICT_VALUE = {Verdict.PROMOTE: 1, Verdict.CONTINUE: 0, Verdict.ROLLBACK: -1}


@dataclass(frozen=True)
class Agreement:
    """A shadow canary's comparisons with the live version, summed."""

    rows: int = 0
    agreeing: int = 0
    kl_sum: float = 0.0
    kl_rows: int = 0  # rows with a KL (none for a deterministic policy)

    def add(self, comparison: Comparison) -> Agreement:
        with_kl = comparison.kl_sum is not None
        return Agreement(
            self.rows + comparison.rows,
            self.agreeing + comparison.agreeing,
            self.kl_sum + (comparison.kl_sum or 0.0),
            self.kl_rows + (comparison.rows if with_kl else 0),
        )

    def merged(self, other: Agreement) -> Agreement:
        return Agreement(
            self.rows + other.rows,
            self.agreeing + other.agreeing,
            self.kl_sum + other.kl_sum,
            self.kl_rows + other.kl_rows,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "agreement": self.agreeing / self.rows if self.rows else None,
            "mean_kl": self.kl_sum / self.kl_rows if self.kl_rows else None,
        }


@dataclass
class Evidence:
    """One worker's evidence on one canary (by its salt)."""

    returns: dict[int, Returns] = field(default_factory=dict)  # by version
    shadow: Agreement = field(default_factory=Agreement)

    def merged(self, other: Evidence) -> Evidence:
        returns = dict(self.returns)
        for version, counted in other.returns.items():
            returns[version] = returns.get(version, Returns()).merged(counted)
        return Evidence(returns, self.shadow.merged(other.shadow))

    def to_bytes(self) -> bytes:
        returns = {str(v): dataclasses.asdict(r) for v, r in self.returns.items()}
        return orjson.dumps({"returns": returns, "shadow": dataclasses.asdict(self.shadow)})

    @classmethod
    def from_bytes(cls, raw: bytes) -> Evidence:
        """A worker's file; ValueError, TypeError or KeyError if it is not one."""
        found = orjson.loads(raw)
        returns = {int(v): Returns(**r) for v, r in found["returns"].items()}
        return cls(returns, Agreement(**found["shadow"]))


@dataclass(frozen=True)
class CanaryStatus:
    """A model's canary now: its plan, the evidence on every worker, the verdict."""

    plan: CanaryPlan
    live_version: int
    evidence: Evidence
    decision: Decision | None  # None: a shadow canary, which the gate does not judge
    workers: int  # whose evidence was merged

    @property
    def live(self) -> Returns:
        return self.evidence.returns.get(self.live_version, Returns())

    @property
    def canary(self) -> Returns:
        return self.evidence.returns.get(self.plan.version, Returns())

    def to_json(self) -> dict[str, Any]:
        answer = {
            "model": self.plan.model,
            "canary": self.plan.to_json(),
            "versions": [
                _side(Arm.LIVE, self.live_version, self.live),
                _side(Arm.CANARY, self.plan.version, self.canary),
            ],
            "workers": self.workers,
        }
        d = self.decision
        if d is None:
            return {
                **answer, "shadow": self.evidence.shadow.to_json(), "verdict": None,
                "reason": "a shadow canary is compared, not judged: its actions were never "
                "taken, so it earned no return",
            }  # fmt: skip
        return {
            **answer,
            "difference": d.difference if self.live.count and self.canary.count else None,
            "interval": [_finite(d.lower), _finite(d.upper)],
            "verdict": d.verdict.value,
            "reason": d.reason,
        }


class CanaryEvidence:
    """This worker's evidence on each model's canary, written for the others, and judged."""

    def __init__(self, manager: ModelRepositoryManager, updater: Updater, metrics: Metrics) -> None:
        self.manager = manager
        self.updater = updater
        self.metrics = metrics
        self._evidence: dict[tuple[str, str], Evidence] = {}  # by (model, salt)
        self._dirty: set[str] = set()  # models whose evidence changed since written
        self._writing: asyncio.Task[None] | None = None

    def reported(self, model: str, report: EpisodeReport) -> None:
        """Count an episode toward the model's canary, if its version is one of its sides."""
        lifecycle = self.manager.lifecycle(model)
        plan = lifecycle.canary
        if plan is None or report.version not in (plan.version, lifecycle.active):
            return
        returns = self._of(plan).returns
        returns[report.version] = returns.get(report.version, Returns()).add(report.value)
        self._changed(model)

    def compared(self, plan: CanaryPlan, comparison: Comparison) -> None:
        """Add a shadow comparison of the canary ``plan`` (the one it was made for)."""
        evidence = self._of(plan)
        evidence.shadow = evidence.shadow.add(comparison)
        self.metrics.shadow_compared(plan.model, comparison.rows, comparison.agreeing)
        self._changed(plan.model)

    async def status(self, model: str) -> CanaryStatus:
        """The model's canary judged on every worker's evidence; NotFound without a canary."""
        lifecycle = self.manager.lifecycle(model)
        plan, live = lifecycle.canary, lifecycle.active
        if plan is None or live is None:
            raise NotFound(
                f"model {model!r} has no canary running; start one with POST "
                f"/v1/models/{model}/canary (rlserve rollout canary start)"
            )
        merged = self._of(plan)
        others = await asyncio.to_thread(read_others, self._folder(plan))
        if lifecycle.canary is not plan:  # ended (or replaced) while the files were read
            return await self.status(model)
        for evidence in others:
            merged = merged.merged(evidence)
        workers = 1 + len(others)
        if plan.mode is CanaryMode.SHADOW:
            return CanaryStatus(plan, live, merged, None, workers)
        on_live = merged.returns.get(live, Returns())
        decision = decide(on_live, merged.returns.get(plan.version, Returns()), plan.gate)
        bounds = (decision.lower, decision.difference, decision.upper)
        self.metrics.canary_judged(model, _VERDICT_VALUE[decision.verdict], bounds)
        return CanaryStatus(plan, live, merged, decision, workers)

    def _of(self, plan: CanaryPlan) -> Evidence:
        return self._evidence.setdefault((plan.model, plan.salt), Evidence())

    def _changed(self, model: str) -> None:
        self._dirty.add(model)
        if self._writing is None or self._writing.done():
            self._writing = asyncio.get_running_loop().create_task(self._write_and_judge())

    async def _write_and_judge(self) -> None:
        """Write the changed models' evidence, then let the gate act on an ``auto`` canary."""
        while self._dirty:
            model = self._dirty.pop()
            try:
                await self._write(model)
                await self._judge(model)
            except RLServeError as exc:
                log.warning("model %s: canary evidence not judged: %s", model, exc.message)
            except Exception:
                log.exception("model %s: writing or judging the canary's evidence failed", model)

    async def _write(self, model: str) -> None:
        plan = self.manager.lifecycle(model).canary
        if plan is None:
            return
        body = self._of(plan).to_bytes()
        await asyncio.to_thread(write_own, self._folder(plan), body)

    async def _judge(self, model: str) -> None:
        plan = self.manager.lifecycle(model).canary
        if plan is None or plan.action is not GateAction.AUTO:
            return
        status = await self.status(model)
        if status.decision is None or status.decision.verdict is Verdict.CONTINUE:
            return
        verdict = status.decision.verdict
        try:
            await self.updater.end_canary(model, verdict, Judge.GATE, plan.salt)
        except NotFound:
            return  # ended meanwhile (another worker's gate, or a person)
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


def write_own(folder: Path, body: bytes) -> None:
    with store.writing_to(folder):
        folder.mkdir(parents=True, exist_ok=True)
        store.write_atomic(_own_file(folder), body, durable=False)


def read_others(folder: Path) -> list[Evidence]:
    """Every other worker's evidence in ``folder`` (unreadable files are skipped: a worker
    may be writing its own)."""
    own = _own_file(folder).name
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json") and n != own]
    except OSError:
        return []
    found = []
    for name in names:
        try:
            found.append(Evidence.from_bytes((folder / name).read_bytes()))
        except (OSError, ValueError, TypeError, KeyError):
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
