"""A rollout worker's episode reports to the server: each finished episode's return, for
the version that served it, as a policy canary is judged by (docs/rollouts.md).

The worker hands every finished episode to an :class:`EpisodeReporter`; the reporter sends
them in batches (``POST /v1/models/{model}/episodes`` with ``{"episodes": [...]}``), at
most every ``EVERY_S`` seconds or once ``BATCH`` are waiting, and the rest when the worker
closes. An episode whose steps were served by two versions (a swap, a canary's end) says
nothing of either and is not reported (counted in ``mixed``).

Reports are evidence, not experience: one that fails is counted (``failed``) and the first
failure logged with its reason; it never stops the worker or delays a step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from client import EpisodeOutcome, PolicyClient, RequestFailed

log = logging.getLogger("rlserve.collect")

BATCH = 256  # reports in one call, at most (the server's limit)
EVERY_S = 1.0


@dataclass
class ReportCounts:
    sent: int = 0
    failed: int = 0
    mixed: int = 0  # episodes of two versions: not reported


class EpisodeReporter:
    """Finished episodes, sent to the server in batches through ``client``."""

    def __init__(self, client: PolicyClient, token: str | None = None) -> None:
        self.client = client
        self.token = token
        self.counts = ReportCounts()
        self._waiting: dict[str, list[EpisodeOutcome]] = {}  # by model
        self._sent_at = time.monotonic()

    def finished(self, model: str, outcome: EpisodeOutcome | None) -> None:
        """An episode ended (None: its steps had two versions); sends when it is time."""
        if outcome is None:
            self.counts.mixed += 1
            return
        waiting = self._waiting.setdefault(model, [])
        waiting.append(outcome)
        if len(waiting) >= BATCH or time.monotonic() - self._sent_at >= EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Send every waiting report."""
        self._sent_at = time.monotonic()
        waiting, self._waiting = self._waiting, {}
        for model, outcomes in waiting.items():
            for start in range(0, len(outcomes), BATCH):
                self._send(model, outcomes[start : start + BATCH])

    def _send(self, model: str, outcomes: list[EpisodeOutcome]) -> None:
        try:
            self.client.report_episodes(model, outcomes, token=self.token)
        except (RequestFailed, OSError) as exc:
            if not self.counts.failed:
                log.warning(
                    "episode reports to the server failed (%s); they are evidence for a "
                    "policy canary only: the worker goes on, and counts what failed",
                    exc,
                )
            self.counts.failed += len(outcomes)
            return
        self.counts.sent += len(outcomes)
