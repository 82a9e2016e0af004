"""Episode reports: the return each episode earned, by the version that served it (issue 45).

A client that ran an episode on a policy reports its outcome, stamped with the version that
answered its steps (every answer carries it):

    POST /v1/models/{model}/episodes
    {"model_version": 3, "return": 187.0, "length": 187, "terminated": true, "truncated": false}

or several at once, ``{"episodes": [report, ...]}`` (up to ``MAX_REPORTS``: a rollout
worker sends the episodes that ended since its last batch).

The server keeps, per model and version, the returns' running count, mean and variance
(``return_gate.Returns``), how many episodes terminated or were truncated, their mean length,
and a bounded reservoir of returns (a uniform sample of every episode reported, for
quantiles); ``GET /v1/models/{model}/episodes`` shows them, and the metrics export them by
model and version: ``rlserve_episode_return`` (a histogram: the distribution; returns may be
negative, so it has no ``_sum``), ``rlserve_episode_returns`` (a summary: ``_sum / _count``
is the mean) and ``rlserve_episodes_total`` (by how episodes ended). A canary's gate
(``return_gate``) reads them.

The route is open unless ``episode_token`` is set (then ``Authorization: Bearer`` it).
Each server process keeps its own tallies (gunicorn workers: the metrics add up across
them; the JSON view is the answering worker's).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from pydantic import SecretStr
from starlette.responses import Response

from kernel.errors import InvalidInput
from kernel.json_shown import json_shown
from serve.control.http_bodies import json_response, read_json_object
from serve.control.manager import ModelRepositoryManager
from serve.control.return_gate import Returns
from serve.frontends.access import check_bearer
from serve.metrics import Metrics

if TYPE_CHECKING:
    from serve.control.canary_evidence import CanaryEvidence

RESERVOIR = 1024  # returns kept per version for quantiles (a uniform sample of all)
MAX_REPORTS = 256  # in one body: {"episodes": [...]}, a rollout worker's batch
REPORTS_BYTES = 64 * 1024  # a report is a handful of fields; a batch of them fits
FIELDS = ("model_version", "return", "length", "terminated", "truncated")


@dataclass(frozen=True)
class EpisodeReport:
    version: int
    value: float  # the episode's return
    length: int | None
    terminated: bool
    truncated: bool


@dataclass
class VersionEpisodes:
    """One version's reported episodes."""

    returns: Returns = field(default_factory=Returns)
    lengths: Returns = field(default_factory=Returns)
    terminated: int = 0
    truncated: int = 0
    reservoir: list[float] = field(default_factory=list)

    def add(self, report: EpisodeReport, rng: random.Random) -> None:
        self.returns = self.returns.add(report.value)
        if report.length is not None:
            self.lengths = self.lengths.add(float(report.length))
        self.terminated += report.terminated
        self.truncated += report.truncated
        seen = self.returns.count
        if len(self.reservoir) < RESERVOIR:
            self.reservoir.append(report.value)
        elif (slot := rng.randrange(seen)) < RESERVOIR:  # each kept with chance RESERVOIR/seen
            self.reservoir[slot] = report.value

    def to_json(self, version: int) -> dict[str, Any]:
        returns = self.returns
        kept = sorted(self.reservoir)
        return {
            "version": version,
            "episodes": returns.count,
            "mean_return": returns.mean,
            "return_stddev": math.sqrt(returns.variance),
            "return_quantiles": {
                f"p{round(q * 100):02d}": _quantile(kept, q) for q in (0.05, 0.5, 0.95)
            },
            "terminated": self.terminated,
            "truncated": self.truncated,
            "mean_length": self.lengths.mean if self.lengths.count else None,
        }


class EpisodeBook:
    """Every model's reported episodes, by version (this process's)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._by_model: dict[str, dict[int, VersionEpisodes]] = {}
        self._rng = random.Random()  # the reservoirs' draws

    def add(self, model: str, report: EpisodeReport) -> None:
        versions = self._by_model.setdefault(model, {})
        versions.setdefault(report.version, VersionEpisodes()).add(report, self._rng)
        self.metrics.episode_reported(model, report.version, report.value, _end(report))

    def to_json(self, model: str) -> dict[str, Any]:
        versions = self._by_model.get(model, {})
        return {"model": model, "versions": [v.to_json(n) for n, v in sorted(versions.items())]}


class EpisodeEndpoints:
    def __init__(
        self,
        manager: ModelRepositoryManager,
        book: EpisodeBook,
        canaries: CanaryEvidence,
        token: SecretStr | None,
    ) -> None:
        self.manager = manager
        self.book = book
        self.canaries = canaries
        self.token = token

    def router(self) -> APIRouter:
        router = APIRouter(tags=["episodes"])
        path = "/v1/models/{model}/episodes"
        router.add_api_route(path, self.report, methods=["POST"], status_code=202)
        router.add_api_route(path, self.summary, methods=["GET"])
        router.add_api_route("/v1/models/{model}/canary", self.canary, methods=["GET"])
        return router

    async def report(self, model: str, request: Request) -> Response:
        """One episode's outcome, stamped with the version that served its steps (or
        ``{"episodes": [...]}``: several); all are checked before any counts."""
        if self.token is not None:
            check_bearer(self.token, request.headers.get("authorization", ""), "episode reports")
        self.manager.lifecycle(model)  # NotFound for a model not served
        body = await read_json_object(request, REPORTS_BYTES)
        batch = "episodes" in body
        reports = parse_reports(body) if batch else [parse_report(body)]
        for report in reports:
            self.book.add(model, report)
            self.canaries.reported(model, report)
        if batch:
            return json_response({"model": model, "episodes": len(reports)}, status=202)
        return json_response({"model": model, "model_version": reports[0].version}, status=202)

    async def summary(self, model: str) -> Response:
        """The model's reported episodes, by version."""
        self.manager.lifecycle(model)  # NotFound for a model not served
        return json_response(self.book.to_json(model))

    async def canary(self, model: str) -> Response:
        """The model's canary: both sides' returns on every worker, the interval and the
        gate's verdict (404 without a canary)."""
        return json_response((await self.canaries.status(model)).to_json())


def parse_reports(body: dict[str, Any]) -> list[EpisodeReport]:
    """A batch of reports, ``{"episodes": [...]}``, each checked (InvalidInput names the
    first wrong one by its place)."""
    unknown = sorted(set(body) - {"episodes"})
    episodes = body["episodes"]
    if unknown or not isinstance(episodes, list) or not 0 < len(episodes) <= MAX_REPORTS:
        raise InvalidInput(
            f'episodes: expected {{"episodes": [report, ...]}} with 1 to {MAX_REPORTS} '
            f"reports and nothing else, each {list(FIELDS)}"
        )
    reports = []
    for place, given in enumerate(episodes):
        if not isinstance(given, dict):
            raise InvalidInput(f"episodes[{place}]: expected an object, got {json_shown(given)}")
        try:
            reports.append(parse_report(given))
        except InvalidInput as exc:
            raise InvalidInput(f"episodes[{place}]: {exc.message}") from None
    return reports


def parse_report(body: dict[str, Any]) -> EpisodeReport:
    """An episode report's fields, checked (InvalidInput names the first wrong one)."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidInput(f"unknown field(s) {unknown}; an episode report has {list(FIELDS)}")
    version = body.get("model_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInput(
            "model_version: expected the version that served the episode (a positive "
            f"integer, as every answer's model_version says), got {json_shown(version)}"
        )
    value = body.get("return")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"return: expected a finite number, got {json_shown(value)}")
    length = body.get("length")
    if length is not None and (
        isinstance(length, bool) or not isinstance(length, int) or length < 1
    ):
        raise InvalidInput(
            f"length: expected a positive integer of steps, got {json_shown(length)}"
        )
    ends = {}
    for name in ("terminated", "truncated"):
        given = body.get(name, False)
        if not isinstance(given, bool):
            raise InvalidInput(f"{name}: expected true or false, got {json_shown(given)}")
        ends[name] = given
    return EpisodeReport(version, float(value), length, ends["terminated"], ends["truncated"])


def _end(report: EpisodeReport) -> str:
    if report.terminated:
        return "terminated"
    return "truncated" if report.truncated else "reported"


def _quantile(kept: list[float], q: float) -> float | None:
    """Nearest-rank quantile of sorted values (None: none)."""
    if not kept:
        return None
    return kept[min(len(kept) - 1, max(0, math.ceil(q * len(kept)) - 1))]
