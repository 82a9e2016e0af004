"""locust as users run it: ``locust -f loadtests/ --headless`` in a subprocess.

Counts come from ``--json-file``, written at exit; failures by error text from the CSV
``--csv`` writes, which locust rewrites every second but not at exit (it can miss the
last second of a run).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LocustRun:
    code: int
    output: str
    csv_prefix: Path

    def entries(self) -> list[dict[str, Any]]:
        """locust's final statistics, one entry per request name."""
        return list(json.loads(Path(f"{self.csv_prefix}.json").read_text()))

    @property
    def requests(self) -> int:
        return sum(int(entry["num_requests"]) for entry in self.entries())

    @property
    def failures(self) -> int:
        return sum(int(entry["num_failures"]) for entry in self.entries())

    def errors(self) -> Counter[str]:
        """Failures by locust's error text (e.g. "ConnectionRefusedError(111, ...)")."""
        errors: Counter[str] = Counter()
        with open(f"{self.csv_prefix}_failures.csv", newline="") as f:
            for row in csv.DictReader(f):
                errors[row["Error"]] += int(row["Occurrences"])
        return errors


class Locust:
    """A headless locust run on loadtests/, started at once; ``wait`` collects it."""

    def __init__(
        self, url: str, tmp: Path, *flags: str, users: int = 8, seconds: float = 5
    ) -> None:
        self.csv_prefix = tmp / "locust"
        command = [
            sys.executable, "-m", "locust", "-f", "loadtests/", "--headless", "--host", url,
            "-u", str(users), "-r", str(users), "-t", f"{seconds}s", "--only-summary",
            "--csv", str(self.csv_prefix), "--json-file", str(self.csv_prefix), *flags,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def wait(self, timeout_s: float = 60) -> LocustRun:
        output, _ = self.process.communicate(timeout=timeout_s)
        return LocustRun(self.process.returncode, output, self.csv_prefix)


def run_locust(url: str, tmp: Path, *flags: str, users: int = 8, seconds: float = 5) -> LocustRun:
    return Locust(url, tmp, *flags, users=users, seconds=seconds).wait()
