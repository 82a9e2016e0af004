"""TensorBoard event files read back with TensorBoard's own reader (the runs write them
with tensorboardX: loop/scalars.py)."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every point of ``tag`` in the event files under ``logdir``."""
    assert any(logdir.glob("events.out.tfevents.*")), f"no event file in {logdir}"
    events = EventAccumulator(str(logdir))
    events.Reload()
    assert tag in events.Tags()["scalars"], events.Tags()["scalars"]
    return [(e.step, e.value) for e in events.Scalars(tag)]


def rises(points: list[tuple[int, float]]) -> bool:
    """The last point is above the first: the run learned."""
    return len(points) >= 2 and points[-1][1] > points[0][1]
