"""Online features (issue #24): the ``features`` scenario.

One ``redis-server`` (in memory) on the load core, holding ``ENTITIES`` entities of the mlp
model's 376 features twice, in both plain-Redis layouts docs/serving.md gives: a hash of
text fields per entity (``layout: hash``) and a packed float32 vector per entity
(``layout: float32``). ``rlserve serve`` on the server core serves the mlp model three
times: without a view, and with a view of each layout; wrk on the load core at 64
connections, side by side in one run:

- **inline**: every request posts one observation (the mlp scenario's body);
- **by entity** (each layout): every request posts an entity id (wrk's Lua script counts
  through the entities), and the server reads its 376 features from Redis.

Each mode gets ``warmup`` seconds of the same load, then ``seconds`` measured:
requests/s, p50 and p99 at the client, errors, the server's CPU per request, and for the
entity mode the server's own counts over the measured run: round trips to Redis (one
serves every request waiting together) and each request's mean wait for its features.
Target: a by-entity mode's p99 within 2 ms of the inline mode's.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import httpx
import numpy as np
import orjson

from bench import brokers, cpu, load, models, scenarios, servers
from bench.brokers import Broker, Unavailable
from bench.load import LoadResult

CONNECTIONS = 64
ENTITIES = 1000
MAX_P99_EXTRA_MS = 2.0  # target: by entity, p99 within this of inline's
TIMEOUT_MS = 50  # the view's timeout_ms
_ROUND_TRIPS = "rlserve_feature_store_round_trips_total"
_WAIT_SUM = "rlserve_feature_lookup_seconds_sum"


class Mode(Enum):
    INLINE = "observations inline"
    HASH = "entity ids, features from Redis hashes (text fields)"
    FLOAT32 = "entity ids, features from Redis float32 vectors"

    @property
    def model(self) -> str:
        return {Mode.INLINE: "mlp", Mode.HASH: "mlp_hash", Mode.FLOAT32: "mlp_float32"}[self]


@dataclass(frozen=True)
class FeatureRow:
    mode: Mode
    load: LoadResult | None
    failure: str | None
    server_cpu_s: float
    round_trips: float  # the entity mode's, over the measured run
    wait_s: float  # the entity mode's requests' summed wait for their features

    @property
    def server_us_per_request(self) -> float | None:
        requests = self.load.requests if self.load is not None else 0
        return self.server_cpu_s * 1e6 / requests if requests else None

    @property
    def requests_per_round_trip(self) -> float | None:
        requests = self.load.requests if self.load is not None else 0
        return requests / self.round_trips if self.round_trips else None

    @property
    def mean_wait_ms(self) -> float | None:
        requests = self.load.requests if self.load is not None else 0
        return self.wait_s * 1e3 / requests if requests and self.wait_s else None


@dataclass(frozen=True)
class FeaturesRun:
    when: str
    seconds: float
    measured_s: float
    warmup_s: float
    machine: str
    load_before: str
    load_after: str
    redis: str
    rows: tuple[FeatureRow, ...]
    failure: str | None

    def row(self, mode: Mode) -> FeatureRow | None:
        return next((r for r in self.rows if r.mode is mode), None)


def run(repository: Path, workdir: Path, seconds: int, warmup: int) -> FeaturesRun:
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = cpu.loadavg()
    machine = cpu.machine()
    rows: list[FeatureRow] = []
    failure = None
    try:
        store = brokers.redis(
            workdir / "features-redis", options=("--appendonly", "no"), core=cpu.LOAD_CORE
        )
    except Unavailable as exc:
        failure = str(exc)
    else:
        try:
            _fill(store)
            server = _serve(repository / models.MLP.name, workdir, store)
            try:
                rows = [_measure(server, mode, seconds, warmup) for mode in Mode]
            finally:
                server.stop()
        except (RuntimeError, TimeoutError) as exc:
            failure = str(exc)[:500]
        finally:
            store.stop()
    return FeaturesRun(
        when, time.monotonic() - started, float(seconds), float(warmup), machine, load_before,
        cpu.loadavg(), brokers.redis_version(), tuple(rows), failure,
    )  # fmt: skip


def _features() -> list[str]:
    return [f"f{i}" for i in range(models.MLP.observation["shape"][0])]


def _fill(store: Broker) -> None:
    """ENTITIES entities of random features (seeded): a hash at e:<id>, and the same values
    packed as float32 at p:<id>."""
    import redis

    names = _features()
    rng = np.random.default_rng(0)
    with redis.Redis(port=store.port) as client:
        pipe = client.pipeline(transaction=False)
        for entity in range(ENTITIES):
            values = rng.standard_normal(len(names)).astype(np.float32)
            pipe.hset(f"e:{entity}", mapping=dict(zip(names, map(float, values), strict=True)))
            pipe.set(f"p:{entity}", values.astype("<f4").tobytes())
        pipe.execute()


def _serve(model: Path, workdir: Path, store: Broker) -> servers.Server:
    repository = workdir / "features-repository"
    listed = ", ".join(_features())
    for mode in Mode:
        if not (repository / mode.model).exists():
            shutil.copytree(model, repository / mode.model)
        if mode is Mode.INLINE:
            continue
        layout, prefix = ("hash", "e:") if mode is Mode.HASH else ("float32", "p:")
        (repository / mode.model / "config.yaml").write_text(
            f"features:\n  store: redis://127.0.0.1:{store.port}/0\n  entity: e\n"
            f"  key_prefix: '{prefix}'\n  layout: {layout}\n  features: [{listed}]\n"
            f"  timeout_ms: {TIMEOUT_MS}\n"
        )
    command = [sys.executable, "-m", "cli", "serve", "--model-repository", str(repository)]
    server = servers.Server(command, {}, workdir / "features.log", cpu.SERVER_CORE)
    server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", 120)
    return server


def _measure(server: servers.Server, mode: Mode, seconds: int, warmup: int) -> FeatureRow:
    _say(f"  {mode.value}, {CONNECTIONS} connections")
    url = f"{server.url}/v1/models/{mode.model}/predict"
    try:
        _wrk(url, mode, warmup)
        with httpx.Client(base_url=server.url, timeout=10) as client:
            before = _counts(client)
            cpu_before = server.cpu_seconds()
            result = _wrk(url, mode, seconds)
            server_s = server.cpu_seconds() - cpu_before
            after = _counts(client)
    except (RuntimeError, httpx.HTTPError) as exc:
        return FeatureRow(mode, None, str(exc)[:300], 0.0, 0.0, 0.0)
    if result.errors:
        _say(f"  {result.errors} errors; server log:\n{server.log_tail()}")
    trips, wait = after[0] - before[0], after[1] - before[1]
    return FeatureRow(mode, result, None, server_s, trips, wait)


def _counts(client: httpx.Client) -> tuple[float, float]:
    """The server's round trips to the store, and its requests' summed wait (s)."""
    trips = wait = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(_ROUND_TRIPS):
            trips += float(line.rsplit(" ", 1)[1])
        elif line.startswith(_WAIT_SUM):
            wait += float(line.rsplit(" ", 1)[1])
    return trips, wait


def _wrk(url: str, mode: Mode, seconds: int) -> LoadResult:
    if mode is Mode.INLINE:
        body = orjson.dumps({"observations": scenarios.observation(models.MLP.name)})
        return load.post(url, body, CONNECTIONS, seconds)
    with tempfile.TemporaryDirectory(prefix="bench-features-") as tmp:
        script = Path(tmp) / "entities.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            "local n = 0\n"
            "request = function()\n"
            "  n = n + 1\n"
            f"  return wrk.format(nil, nil, nil, '{{\"entities\":' .. (n % {ENTITIES}) .. '}}')\n"
            "end\n"
        )
        command = [
            load.require_wrk(), "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency",
            "-s", str(script), url,
        ]  # fmt: skip
        done = subprocess.run(cpu.pinned(command, cpu.LOAD_CORE), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return load.parse(done.stdout)


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
