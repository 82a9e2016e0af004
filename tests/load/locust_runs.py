"""locust as users run it: ``locust -f loadtests/ --headless`` in a subprocess, with CSV."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LocustRun:
    code: int
    output: str
    csv_prefix: Path

    def aggregated(self) -> dict[str, str]:
        """The 'Aggregated' row of locust's stats CSV: every predict request of the run."""
        with open(f"{self.csv_prefix}_stats.csv", newline="") as f:
            return next(row for row in csv.DictReader(f) if row["Name"] == "Aggregated")

    @property
    def requests(self) -> int:
        return int(self.aggregated()["Request Count"])

    @property
    def failures(self) -> int:
        return int(self.aggregated()["Failure Count"])

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
            "--csv", str(self.csv_prefix), *flags,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def wait(self, timeout_s: float = 60) -> LocustRun:
        output, _ = self.process.communicate(timeout=timeout_s)
        return LocustRun(self.process.returncode, output, self.csv_prefix)


def run_locust(url: str, tmp: Path, *flags: str, users: int = 8, seconds: float = 5) -> LocustRun:
    return Locust(url, tmp, *flags, users=users, seconds=seconds).wait()
