"""The result cache (issue #13): the ``cache`` scenario.

One ``redis-server`` (in memory: no AOF, no snapshots; ``maxmemory 256mb`` with
``allkeys-lru``, the bound docs/serving.md advises) on the load core, with wrk. For each of the mlp
and cnn models, ``rlserve serve`` on the server core and wrk on the load core, side by
side in one run, at 1 and at 64 connections:

- **model run**: the server without a cache, posting one fixed observation (the model runs
  for every request: what the cache saves);
- **cache hit**: the server with ``result_cache`` set, posting the same observation: after
  the first request every answer comes from Redis;
- **cache miss**: the same server, every request a new observation (its first three
  values counted up by wrk's Lua script from an offset of its own per run), so every
  request looks up, misses, runs the model and hands its answer to be written.

Each run is ``warmup`` seconds of the same load, then ``seconds`` measured: requests/s,
p50 and p99 at the client, the server's CPU time per request and Redis's, and the lookups
the server counted by result over the measured run. The targets are judged in
bench/targets.py.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import httpx
import orjson

from bench import brokers, cpu, load, models, scenarios, servers
from bench.brokers import Broker, Unavailable
from bench.load import LoadResult

MODELS = (models.MLP.name, models.CNN.name)
CONNECTIONS = (1, 64)
TTL_S = 3600  # nothing expires during a run
LOOKUPS = "rlserve_result_cache_lookups_total"
RESULTS = ("hit", "miss", "error", "unavailable")
_RUN_OFFSET = 1 << 22  # each miss run counts from its own offset: no run repeats another's

# targets (issue #13: a hit must pay where the model run is the expensive part)
MAX_CNN_HIT_SHARE = 1.0  # cnn: a hit's p50 at 1 connection, below this share of a run's
MIN_HIT_RATIO = 0.95  # the hit rows: lookups that were hits (the rest: counted errors)


class Path_(Enum):  # noqa: N801 - "Path" is pathlib's
    """What a request's answer costs."""

    MODEL = "model run (no cache)"
    HIT = "cache hit"
    MISS = "cache miss (lookup, model run, write)"


@dataclass(frozen=True)
class CacheRow:
    model: str
    path: Path_
    connections: int
    load: LoadResult | None
    failure: str | None
    server_cpu_s: float
    redis_cpu_s: float
    lookups: dict[str, float]  # by result, over the measured run

    def _per_request(self, seconds: float) -> float | None:
        requests = self.load.requests if self.load is not None else 0
        return seconds * 1e6 / requests if requests else None

    @property
    def server_us_per_request(self) -> float | None:
        return self._per_request(self.server_cpu_s)

    @property
    def redis_us_per_request(self) -> float | None:
        return self._per_request(self.redis_cpu_s) if self.path is not Path_.MODEL else None

    @property
    def hit_ratio(self) -> float | None:
        asked = sum(self.lookups.values())
        return self.lookups.get("hit", 0.0) / asked if asked else None


@dataclass(frozen=True)
class CacheRun:
    when: str
    seconds: float  # the scenario's wall time
    measured_s: float
    warmup_s: float
    machine: str
    load_before: str
    load_after: str
    redis: str  # redis-server's version, as it says
    rows: tuple[CacheRow, ...]
    failure: str | None  # why nothing was measured (no redis-server)

    def row(self, model: str, path: Path_, connections: int) -> CacheRow | None:
        return next(
            (
                r
                for r in self.rows
                if (r.model, r.path, r.connections) == (model, path, connections)
            ),
            None,
        )


def run(repository: Path, workdir: Path, seconds: int, warmup: int) -> CacheRun:
    """The scenario on the benchmark repository's mlp and cnn models."""
    started = time.monotonic()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = cpu.loadavg()
    machine = cpu.machine()
    rows: list[CacheRow] = []
    failure = None
    try:
        store = _redis(workdir / "cache-redis")
    except Unavailable as exc:
        failure = str(exc)
    else:
        try:
            for model in MODELS:
                rows += _model_rows(repository / model, workdir, store, seconds, warmup)
        finally:
            store.stop()
    return CacheRun(
        when, time.monotonic() - started, float(seconds), float(warmup), machine, load_before,
        cpu.loadavg(), brokers.redis_version(), tuple(rows), failure,
    )  # fmt: skip


def _redis(directory: Path) -> Broker:
    """``redis-server`` on the load core (a Redis of its own host takes nothing from the
    server's core), in memory, bounded as docs/serving.md advises."""
    in_memory = ("--appendonly", "no", "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru")
    return brokers.redis(directory, options=in_memory, core=cpu.LOAD_CORE)


def _model_rows(
    model: Path, workdir: Path, store: Broker, seconds: int, warmup: int
) -> list[CacheRow]:
    body = orjson.dumps({"observations": scenarios.observation(model.name)})
    rows = []
    _say(f"{model.name}: rlserve serve without a cache")
    server = _serve(model, workdir, None, body)
    try:
        rows += [
            _measure(model.name, Path_.MODEL, server, store, body, c, seconds, warmup)
            for c in CONNECTIONS
        ]
    finally:
        server.stop()
    _say(f"{model.name}: rlserve serve with result_cache")
    server = _serve(model, workdir, f"redis://127.0.0.1:{store.port}/0", body)
    try:
        for c in CONNECTIONS:
            rows.append(_measure(model.name, Path_.HIT, server, store, body, c, seconds, warmup))
            rows.append(_measure(model.name, Path_.MISS, server, store, body, c, seconds, warmup))
    finally:
        server.stop()
    return rows


def _serve(model: Path, workdir: Path, cache: str | None, body: bytes) -> servers.Server:
    """rlserve serve on the server core, serving ``model`` alone; with ``cache``, once its
    link to Redis is connected (the first requests run the model without asking)."""
    repository = workdir / f"cache-{model.name}-{'on' if cache else 'off'}"
    if not repository.exists():
        shutil.copytree(model, repository / model.name)
    env = {}
    if cache is not None:
        env = {"RLSERVE_RESULT_CACHE": cache, "RLSERVE_RESULT_CACHE_TTL_S": str(TTL_S)}
    command = [sys.executable, "-m", "cli", "serve", "--model-repository", str(repository)]
    log = workdir / f"cache-{model.name}-{'on' if cache else 'off'}.log"
    server = servers.Server(command, env, log, cpu.SERVER_CORE)
    server.wait_until(lambda c: c.get("/ready").status_code == 200, "ready", 120)
    if cache is not None:

        def asked(client: httpx.Client) -> bool:
            client.post("/predict", content=body)
            counted = _lookups(client, model.name)
            return counted["hit"] + counted["miss"] > 0

        server.wait_until(asked, "connected to the result cache", 30)
    return server


def _measure(
    model: str,
    path: Path_,
    server: servers.Server,
    store: Broker,
    body: bytes,
    connections: int,
    seconds: int,
    warmup: int,
) -> CacheRow:
    _say(f"  {path.value}, {connections} connection{'s' if connections > 1 else ''}")
    url = f"{server.url}/predict"
    offset = (2 * CONNECTIONS.index(connections)) * _RUN_OFFSET
    try:
        _post(url, body, connections, warmup, path, offset)
        with httpx.Client(base_url=server.url, timeout=10) as client:
            before = _lookups(client, model)
            cpu_before = server.cpu_seconds(), cpu.tree_seconds(store.process.pid)
            result = _post(url, body, connections, seconds, path, offset + _RUN_OFFSET)
            server_s = server.cpu_seconds() - cpu_before[0]
            redis_s = cpu.tree_seconds(store.process.pid) - cpu_before[1]
            after = _lookups(client, model)
    except (RuntimeError, httpx.HTTPError) as exc:
        return CacheRow(model, path, connections, None, str(exc)[:300], 0.0, 0.0, {})
    lookups = {r: after[r] - before[r] for r in RESULTS}
    if result.errors:
        _say(f"  {result.errors} errors; server log:\n{server.log_tail()}")
    return CacheRow(model, path, connections, result, None, server_s, redis_s, lookups)


def _post(
    url: str, body: bytes, connections: int, seconds: int, path: Path_, offset: int
) -> LoadResult:
    if path is not Path_.MISS:
        return load.post(url, body, connections, seconds)
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        script = Path(tmp) / "miss.lua"
        script.write_text(_miss_script(body, Path(tmp), offset))
        command = [
            load.require_wrk(), "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
            "-s", str(script), url,
        ]  # fmt: skip
        done = subprocess.run(cpu.pinned(command, cpu.LOAD_CORE), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return load.parse(done.stdout)


def _miss_script(body: bytes, folder: Path, offset: int) -> str:
    """A wrk script posting ``body`` with its first three observation values replaced by
    a count (each 0..255: valid for float and uint8 observations alike), one per request."""
    start = body.index(b"[")
    while body[start : start + 1] == b"[":
        start += 1  # the innermost list of the observation's first row
    rest = start
    for _ in range(3):
        rest = body.index(b",", rest) + 1
    prefix, suffix = folder / "prefix", folder / "suffix"
    prefix.write_bytes(body[:start])
    suffix.write_bytes(b"," + body[rest:])
    return (
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'local f = assert(io.open({json.dumps(str(prefix))}, "rb")); '
        'local prefix = f:read("*a"); f:close()\n'
        f'f = assert(io.open({json.dumps(str(suffix))}, "rb")); '
        'local suffix = f:read("*a"); f:close()\n'
        f"local n = {offset}\n"
        "request = function()\n"
        "  n = n + 1\n"
        "  local body = prefix .. (n % 256) .. ',' .. (math.floor(n / 256) % 256) .. ',' ..\n"
        "    (math.floor(n / 65536) % 256) .. suffix\n"
        "  return wrk.format(nil, nil, nil, body)\n"
        "end\n"
    )


def _lookups(client: httpx.Client, model: str) -> dict[str, float]:
    """The server's result-cache lookups of ``model`` by result, as /metrics says now."""
    counted = dict.fromkeys(RESULTS, 0.0)
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(LOOKUPS + "{") and f'model="{model}"' in line:
            for result in RESULTS:
                if f'result="{result}"' in line:
                    counted[result] += float(line.rsplit(" ", 1)[1])
    return counted


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)
