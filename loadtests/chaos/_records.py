"""One record per request the chaos load sent: when, how it ended, and on which connection.

Written by the locust process (steady and burst users) and by the slow clients; read by
the accounting (``_accounting``). Times are ``time.monotonic()`` seconds, one clock for
every process on the machine, so records compare with the faults' times.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson


class Source(StrEnum):
    """Who sent the request."""

    STEADY = "steady"  # the actors and vectorised actors, all run long
    BURST = "burst"  # the burst users, only while the burst fault lasts
    SLOW = "slow"  # a slow client trickling its body


class Stage(StrEnum):
    """How far a request got when it failed (DONE: an HTTP answer came back)."""

    CONNECT = "connect"  # no connection: the server never saw it
    SEND = "send"  # the connection broke while the request was being written
    RECEIVE = "receive"  # sent in full; the connection broke or timed out before an answer
    DONE = "done"


@dataclass(slots=True)
class RequestRecord:
    source: Source
    started: float
    ended: float
    status: int = 0  # 0: no HTTP answer
    stage: Stage = Stage.DONE
    error: str = ""  # the client's exception when there was no answer
    port: int = 0  # the client's local port: which connection (0: none was made)
    version: int = 0  # X-Policy-Version of a 2xx answer
    body: str = ""  # the start of a non-2xx answer's body

    @property
    def latency_ms(self) -> float:
        return (self.ended - self.started) * 1000

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source.value,
            "started": self.started,
            "ended": self.ended,
            "status": self.status,
            "stage": self.stage.value,
            "error": self.error,
            "port": self.port,
            "version": self.version,
            "body": self.body,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RequestRecord:
        return cls(
            Source(raw["source"]),
            float(raw["started"]),
            float(raw["ended"]),
            int(raw["status"]),
            Stage(raw["stage"]),
            str(raw["error"]),
            int(raw["port"]),
            int(raw["version"]),
            str(raw["body"]),
        )


def write_records(path: Path, records: Iterable[RequestRecord]) -> None:
    """All at once, renamed into place: a reader sees every record or none."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        for record in records:
            f.write(orjson.dumps(record.to_json()) + b"\n")
    os.replace(partial, path)


def read_records(path: Path) -> list[RequestRecord]:
    with open(path, "rb") as f:
        return [RequestRecord.from_json(orjson.loads(line)) for line in f if line.strip()]
