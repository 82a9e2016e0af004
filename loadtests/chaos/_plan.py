"""What the chaos run asks of its locust process, and the files through which it steers it.

The run writes a :class:`LoadPlan` as JSON and names it in ``RLSERVE_CHAOS_PLAN``; the
locustfile (``_users.py``) reads it at import. While locust runs, the run steers it with
flag files in the plan's control folder: ``burst`` present means the burst users send,
``stop`` present means every user stops after its request in flight and the records are
written to ``records.jsonl``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

PLAN_ENV = "RLSERVE_CHAOS_PLAN"


@dataclass(frozen=True)
class LoadPlan:
    host: str
    model: str
    deterministic: bool
    batch_rows: int
    think_time_s: float
    deadline_ms: float | None  # sent as X-Request-Timeout-Ms; None: the server's default
    timeout_s: float  # a request with no answer after this long is lost
    actor_users: int
    vector_users: int
    burst_users: int
    control_dir: str

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> LoadPlan:
        return cls(**json.loads(path.read_text()))

    @property
    def control(self) -> ControlFiles:
        return ControlFiles(Path(self.control_dir))


@dataclass(frozen=True)
class ControlFiles:
    root: Path

    @property
    def burst(self) -> Path:
        """Present: the burst users send back to back."""
        return self.root / "burst"

    @property
    def stop(self) -> Path:
        """Present: no user starts another request; the records are then written."""
        return self.root / "stop"

    @property
    def running(self) -> Path:
        """Written by locust once its first request was answered."""
        return self.root / "running"

    @property
    def records(self) -> Path:
        """Every request the users sent, one JSON object a line (``_records``)."""
        return self.root / "records.jsonl"
