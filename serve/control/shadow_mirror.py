"""A shadow canary: its version run on a share of the live version's batches, compared,
never answered (issue 45).

For environments where a bad action costs too much to let a canary act, a canary can run
in shadow (``mode: shadow``): every call is served by the live version as usual, and the
mirror, a record sink every model's scheduler hands its batches to, takes ``share`` of the
live version's batches (drawn at random per batch) and runs the canary's version on the
same graph inputs on a worker thread. The model's kind compares the two
(``KindPlugin.compare``: for a policy, action agreement and KL(live || canary)) and the
comparison joins the canary's evidence (``serve.control.canary_evidence``), across
workers.

The request path pays nothing for it: ``accept`` is a lookup and a draw per batch on the
event loop, and at most ``PENDING`` batches wait for the thread; a batch that finds them
all waiting is not mirrored (the comparison is a sample). Without a shadow canary,
``accept`` returns at the lookup.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from dataclasses import dataclass

from serve.batching.record import BatchRecord
from serve.control.canary_assignment import CanaryPlan
from serve.control.canary_evidence import CanaryEvidence
from serve.control.manager import ModelRepositoryManager
from serve.dataplane.model import ServedModel
from serve.plugins import plugin_of
from serve.types import CanaryMode

log = logging.getLogger("rlserve.canary")

PENDING = 4  # mirrored batches waiting for the thread, at most


@dataclass(frozen=True)
class _Mirrored:
    plan: CanaryPlan
    live: ServedModel
    canary: ServedModel
    record: BatchRecord


class ShadowMirror:
    """The record sink of every model: mirrors a shadow canary's share of live batches."""

    def __init__(self, manager: ModelRepositoryManager, evidence: CanaryEvidence) -> None:
        self.manager = manager
        self.evidence = evidence
        self._pending: deque[_Mirrored] = deque()
        self._running: asyncio.Task[None] | None = None
        self._draws = random.Random()

    def accept(self, record: BatchRecord) -> None:
        lifecycle = self.manager.models.get(record.model)
        plan = None if lifecycle is None else lifecycle.canary
        if plan is None or plan.mode is not CanaryMode.SHADOW or record.version == plan.version:
            return
        if self._draws.random() >= plan.share:
            return
        assert lifecycle is not None
        live, canary = lifecycle.get(record.version), lifecycle.get(plan.version)
        if live is None or canary is None:
            return  # unloaded meanwhile
        if len(self._pending) >= PENDING:
            return  # the thread is behind: a sample can do without this batch
        self._pending.append(_Mirrored(plan, live, canary, record))
        if self._running is None or self._running.done():
            self._running = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._pending:
            mirrored = self._pending.popleft()
            compare = plugin_of(mirrored.live.model_kind).compare
            if compare is None:
                continue
            record = mirrored.record
            try:
                comparison = await asyncio.to_thread(
                    compare, mirrored.live, mirrored.canary, record.inputs, record.requests
                )
            except Exception:
                log.exception(
                    "model %s: the shadow canary version %d failed on a mirrored batch",
                    record.model,
                    mirrored.plan.version,
                )
                continue
            self.evidence.compared(mirrored.plan, comparison)
