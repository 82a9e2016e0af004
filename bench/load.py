"""Load from wrk (a C load generator), pinned to the load core: one thread, N connections.

wrk runs a closed loop: each connection sends its next request when the previous answer
arrives (whatever its status: a 429 is retried at once, Retry-After or not). The request
body is written to a file that the Lua script reads, so any JSON (nested arrays included)
goes on the wire unchanged. Asked to, the script also counts answers by status (a Lua
``response`` callback per thread, summed in ``done``), which costs wrk some speed: only the
overload scenario asks.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import cpu

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_STATUSES = "statuses:"  # the line the counting script's done() writes


@dataclass(frozen=True)
class Statuses:
    """Answers by status, as the wrk script counted them."""

    ok: int  # 2xx
    too_many: int  # 429: refused at admission
    unavailable: int  # 503
    deadline: int  # 504: the request's deadline passed in the server
    other: int  # any other status

    @property
    def refused(self) -> int:
        return self.too_many + self.unavailable + self.deadline


@dataclass(frozen=True)
class LoadResult:
    requests: int  # completed, whatever their status
    requests_per_s: float
    p50_ms: float  # of every answer, whatever its status
    p99_ms: float
    errors: int  # non-2xx/3xx answers and socket errors
    seconds: float  # the run's length as wrk measured it
    socket_errors: int  # connect, read, write and timeout errors
    statuses: Statuses | None  # when counted (``post(..., count_statuses=True)``)


def require_wrk() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit(
            "bench needs wrk on PATH: apt-get install wrk (Debian/Ubuntu) or brew install wrk"
        )
    return wrk


def post(
    url: str,
    body: bytes,
    connections: int,
    seconds: int,
    *,
    headers: dict[str, str] | None = None,
    count_statuses: bool = False,
    timeout_s: int | None = None,
    lua: str = "",
) -> LoadResult:
    """POST ``body`` (JSON) to ``url`` from ``connections`` connections for ``seconds``
    (whole seconds: wrk's durations take no fractions), with extra ``headers``; answers
    slower than ``timeout_s`` (wrk's default: 2) count as socket timeouts. ``lua``: more of
    wrk's script (a ``request`` function that varies each request, say)."""
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        body_file, script = Path(tmp) / "body.json", Path(tmp) / "post.lua"
        body_file.write_bytes(body)
        text = _script(body_file, headers or {}) + lua
        script.write_text(text + _COUNT_STATUSES if count_statuses else text)
        timeout = [] if timeout_s is None else ["--timeout", f"{timeout_s}s"]
        command = [
            require_wrk(), "-t1", f"-c{connections}", f"-d{seconds}s", *timeout, "--latency",
            "-s", str(script), url,
        ]  # fmt: skip
        done = subprocess.run(cpu.pinned(command, cpu.LOAD_CORE), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return parse(done.stdout)


def parse(out: str) -> LoadResult:
    """A LoadResult from wrk's ``--latency`` report; RuntimeError naming what is missing."""
    requests, length, unit = _find(r"(\d+) requests in ([\d.]+)(us|ms|s|m|h)\b", out)
    socket = _socket_errors(out)
    return LoadResult(
        requests=int(requests),
        requests_per_s=float(_find(r"Requests/sec:\s+([\d.]+)", out)[0]),
        p50_ms=_latency(out, "50%"),
        p99_ms=_latency(out, "99%"),
        errors=_non_2xx(out) + socket,
        seconds=float(length) * _UNITS[unit] / 1e3,
        socket_errors=socket,
        statuses=_statuses(out) if _STATUSES in out else None,
    )


def _script(body_file: Path, headers: dict[str, str]) -> str:
    path = json.dumps(str(body_file))  # a double-quoted string Lua reads the same way
    extra = "".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}\n" for k, v in headers.items())
    return (
        'wrk.method = "POST"\n'
        f'local file = assert(io.open({path}, "rb"))\n'
        'wrk.body = file:read("*a")\n'
        "file:close()\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"{extra}"
    )


# Each wrk thread has its own Lua state: setup() keeps the threads, response() counts in
# each thread's globals, done() sums them from the threads (after the run) and prints.
_COUNT_STATUSES = """
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok, too_many, unavailable, deadline, other = 0, 0, 0, 0, 0 end
function response(status, headers, body)
  if status >= 200 and status < 300 then ok = ok + 1
  elseif status == 429 then too_many = too_many + 1
  elseif status == 503 then unavailable = unavailable + 1
  elseif status == 504 then deadline = deadline + 1
  else other = other + 1 end
end
function done(summary, latency, requests)
  local n = {ok = 0, too_many = 0, unavailable = 0, deadline = 0, other = 0}
  for _, thread in ipairs(threads) do
    for name, _ in pairs(n) do n[name] = n[name] + thread:get(name) end
  end
  io.write(string.format("statuses: 2xx %d 429 %d 503 %d 504 %d other %d\\n",
    n.ok, n.too_many, n.unavailable, n.deadline, n.other))
end
"""


def _statuses(out: str) -> Statuses:
    found = _find(r"statuses: 2xx (\d+) 429 (\d+) 503 (\d+) 504 (\d+) other (\d+)", out)
    return Statuses(*map(int, found))


def _latency(out: str, percentile: str) -> float:
    value, unit = _find(rf"(?m)^\s*{percentile}\s+([\d.]+)(us|ms|s|m|h)\s*$", out)
    return float(value) * _UNITS[unit]


def _find(pattern: str, out: str) -> tuple[str, ...]:
    found = re.search(pattern, out)
    if found is None:
        raise RuntimeError(f"wrk's output lacks {pattern!r}:\n{out}")
    return found.groups()


def _non_2xx(out: str) -> int:
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return int(non_2xx.group(1)) if non_2xx else 0


def _socket_errors(out: str) -> int:
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return sum(map(int, socket.groups())) if socket else 0
