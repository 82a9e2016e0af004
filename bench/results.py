"""What one benchmark run measured: the records the runner fills and the report reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.actor import ActorResult
from bench.cache import CacheRun
from bench.features import FeaturesRun
from bench.grpc_floor import GrpcRun
from bench.grpo import GrpoRun
from bench.lane import LaneRun
from bench.lm import LmRun
from bench.load import LoadResult
from bench.loop import LoopRun
from bench.oip import OipRun
from bench.overload import OverloadRun
from bench.recurrent import RecurrentRun
from bench.scenarios import Scenario
from bench.servers import Setup


@dataclass(frozen=True)
class LoadRun:
    """One measured wrk run against one server setup."""

    scenario: Scenario
    setup: Setup
    load: LoadResult
    server_cpu_s: float  # CPU seconds of the server's process tree during the run

    @property
    def cpu_us_per_request(self) -> float:
        return self.server_cpu_s * 1e6 / self.load.requests if self.load.requests else 0.0


@dataclass(frozen=True)
class RawRun:
    """Back-to-back onnxruntime runs in one thread, no server."""

    model: str
    rows_per_s_batch_1: float
    rows_per_s_batch_32: float


@dataclass(frozen=True)
class ActorRun:
    """The CartPole actor against rlserve serve with one client."""

    actor: ActorResult
    server_cpu_s: float  # over the actor's warm-up and measured steps

    @property
    def cpu_us_per_step(self) -> float:
        steps = self.actor.steps + self.actor.warmup_steps
        return self.server_cpu_s * 1e6 / steps if steps else 0.0


@dataclass(frozen=True)
class Conditions:
    """How the run was made, for the document's header."""

    when: str
    machine: str
    cpus: int
    python: str
    seconds: int
    warmup_s: int
    workers: int
    scenarios: tuple[str, ...]
    all_scenarios: bool


@dataclass
class Results:
    conditions: Conditions
    load: list[LoadRun] = field(default_factory=list)
    raw: list[RawRun] = field(default_factory=list)
    actor: list[ActorRun] = field(default_factory=list)
    overload: OverloadRun | None = None
    oip: OipRun | None = None
    loop: LoopRun | None = None
    lm: LmRun | None = None
    cache: CacheRun | None = None
    recurrent: RecurrentRun | None = None
    features: FeaturesRun | None = None
    grpo: GrpoRun | None = None
    lane: LaneRun | None = None
    grpc: GrpcRun | None = None

    def find(self, scenario: str, setup_key: str) -> LoadRun | None:
        for run in self.load:
            if run.scenario.name == scenario and run.setup.key == setup_key:
                return run
        return None
