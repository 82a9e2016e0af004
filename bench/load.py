"""Load from wrk (a C load generator), pinned to the load core: one thread, N connections.

wrk runs a closed loop: each connection sends its next request when the previous answer
arrives. The request body is written to a file that the Lua script reads, so any JSON
(nested arrays included) goes on the wire unchanged.
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

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True)
class LoadResult:
    requests: int  # completed, whatever their status
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int  # non-2xx/3xx answers and socket errors


def require_wrk() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit(
            "bench needs wrk on PATH: apt-get install wrk (Debian/Ubuntu) or brew install wrk"
        )
    return wrk


def post(url: str, body: bytes, connections: int, seconds: int) -> LoadResult:
    """POST ``body`` (JSON) to ``url`` from ``connections`` connections for ``seconds``
    (whole seconds: wrk's durations take no fractions)."""
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        body_file, script = Path(tmp) / "body.json", Path(tmp) / "post.lua"
        body_file.write_bytes(body)
        script.write_text(_script(body_file))
        command = [
            require_wrk(), "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
            "-s", str(script), url,
        ]  # fmt: skip
        done = subprocess.run(cpu.pinned(command, cpu.LOAD_CORE), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return parse(done.stdout)


def parse(out: str) -> LoadResult:
    """A LoadResult from wrk's ``--latency`` report; RuntimeError naming what is missing."""
    return LoadResult(
        requests=int(_find(r"(\d+) requests in ", out)[0]),
        requests_per_s=float(_find(r"Requests/sec:\s+([\d.]+)", out)[0]),
        p50_ms=_latency(out, "50%"),
        p99_ms=_latency(out, "99%"),
        errors=_errors(out),
    )


def _script(body_file: Path) -> str:
    path = json.dumps(str(body_file))  # a double-quoted string Lua reads the same way
    return (
        'wrk.method = "POST"\n'
        f'local file = assert(io.open({path}, "rb"))\n'
        'wrk.body = file:read("*a")\n'
        "file:close()\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )


def _latency(out: str, percentile: str) -> float:
    value, unit = _find(rf"(?m)^\s*{percentile}\s+([\d.]+)(us|ms|s)\s*$", out)
    return float(value) * _UNITS[unit]


def _find(pattern: str, out: str) -> tuple[str, ...]:
    found = re.search(pattern, out)
    if found is None:
        raise RuntimeError(f"wrk's output lacks {pattern!r}:\n{out}")
    return found.groups()


def _errors(out: str) -> int:
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return (int(non_2xx.group(1)) if non_2xx else 0) + (
        sum(map(int, socket.groups())) if socket else 0
    )
