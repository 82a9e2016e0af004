"""The access log: one JSON line per exchange, the lines of FLUSH_S written together."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from serve.frontends.access import FLUSH_S, AccessLog

pytestmark = pytest.mark.anyio


def scope(path: str) -> dict[str, object]:
    return {"method": "POST", "path": path, "client": ("10.0.0.7", 5123)}


def records(caplog: pytest.LogCaptureFixture) -> list[list[dict[str, object]]]:
    """Each access-log record's lines, parsed."""
    return [
        [json.loads(line) for line in r.getMessage().split("\n")]
        for r in caplog.records
        if r.name == "rlserve.access"
    ]


async def written(caplog: pytest.LogCaptureFixture, count: int) -> list[list[dict[str, object]]]:
    """The access-log records once there are ``count`` of them (5 s at most)."""
    deadline = time.monotonic() + 5
    while len(records(caplog)) < count and time.monotonic() < deadline:
        await asyncio.sleep(FLUSH_S / 10)
    return records(caplog)


async def test_lines_go_out_together_once_the_first_is_flush_s_old(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rlserve.access")
    access = AccessLog()
    started = time.monotonic()
    for i in range(3):
        access.add(scope(f"/v1/models/m{i}/predict"), f"r{i}", 200, 0.0015)
    await asyncio.sleep(0)
    assert records(caplog) == []  # not yet: the next turns may answer more
    (first,) = await written(caplog, 1)
    assert time.monotonic() - started >= FLUSH_S / 2  # (an event loop's timers may round)
    access.add(scope("/predict"), "late", 429, 0.0001)
    second = (await written(caplog, 2))[1]
    assert [line["request_id"] for line in first] == ["r0", "r1", "r2"]
    assert first[0] == {
        "request_id": "r0",
        "method": "POST",
        "path": "/v1/models/m0/predict",
        "status": 200,
        "latency_ms": 1.5,
        "client": "10.0.0.7",
    }
    assert [(line["request_id"], line["status"]) for line in second] == [("late", 429)]


async def test_flush_writes_what_is_gathered_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """At shutdown the last lines are written at once, and only once."""
    caplog.set_level(logging.INFO, logger="rlserve.access")
    access = AccessLog()
    access.add(scope("/predict"), "last", 200, 0.002)
    access.flush()
    assert [[line["request_id"] for line in lines] for lines in records(caplog)] == [["last"]]
    access.add(scope("/predict"), "after", 200, 0.002)
    assert [[line["request_id"] for line in lines] for lines in await written(caplog, 2)] == [
        ["last"],
        ["after"],
    ]  # the flush due for "last" found nothing; "after" got its own
