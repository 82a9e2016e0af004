"""The measuring child processes of the ``loop`` and ``lm`` scenarios: each runs pinned to
one core and prints one JSON line on stdout, read here; and the percentile they report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from bench import cpu

ROOT = Path(__file__).resolve().parents[1]


def measure(command: list[str], core: int, timeout_s: float) -> tuple[dict[str, Any], str | None]:
    """Run a measuring child on ``core``: its JSON line, or why there is none."""
    try:
        done = subprocess.run(
            cpu.pinned(command, core), capture_output=True, text=True, cwd=ROOT,
            timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {}, f"no answer within {timeout_s:g} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {}, f"exited {done.returncode}: {(errors or ['no output'])[-1][:300]}"
    output: dict[str, Any] = json.loads(lines[-1])
    return output, None


def percentile_ms(seconds: list[float], q: float) -> float:
    """The ``q``-th percentile of durations in seconds, in milliseconds (0 when none)."""
    return float(np.percentile(seconds, q) * 1e3) if seconds else 0.0
