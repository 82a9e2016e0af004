"""Load from wrk (a C load generator, so the client is never the bottleneck)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True)
class LoadResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def require_wrk() -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit(
            "bench needs wrk on PATH: apt-get install wrk (Debian/Ubuntu) or brew install wrk"
        )
    return wrk


def post(url: str, body: dict, connections: int, seconds: float) -> LoadResult:
    script = _script(orjson.dumps(body).decode())
    command = [require_wrk(), "-t2", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    done = subprocess.run([*command, "-s", script, url], check=True, capture_output=True, text=True)
    Path(script).unlink()
    out = done.stdout
    return LoadResult(
        requests_per_s=float(_find(r"Requests/sec:\s+([\d.]+)", out)[0]),
        p50_ms=_latency(out, "50%"),
        p99_ms=_latency(out, "99%"),
        errors=_errors(out),
    )


def _script(body: str) -> str:
    lua = (
        f'wrk.method = "POST"\nwrk.body = [[{body}]]\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
        return f.name


def _latency(out: str, percentile: str) -> float:
    value, unit = _find(rf"{percentile}\s+([\d.]+)(us|ms|s)", out)
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
