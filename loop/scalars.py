"""Training you can watch: TensorBoard event files from every loop runner and rollout worker.

Each run writes scalars under ``--logdir`` (default ``runs/<name>-<date>-<time>``, as
CleanRL's scripts do), so ``tensorboard --logdir runs`` shows every run side by side: the
episode return or the reward, the policy version, staleness, the weight update's parts,
steps or tokens per second. ``--logdir none`` writes nothing.

The writer is tensorboardX (the ``loop`` extra: numpy and protobuf, no torch); we looked at
``torch.utils.tensorboard`` too, which would put torch into the rollout workers' install.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path("runs")
OFF = "none"  # --logdir none: no event files


def default_logdir(name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``: a new folder for each run."""
    return ROOT / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def logdir_of(given: str | Path | None, name: str) -> Path | None:
    """The folder a ``--logdir`` flag asks for: its default when absent, None for ``none``."""
    if given is None:
        return default_logdir(name)
    return None if str(given) == OFF else Path(given)


class Scalars:
    """Scalars by tag and step into one run's event files (nothing when ``logdir`` is None).
    Values that are None (nothing measured yet) are left out."""

    def __init__(self, logdir: Path | None) -> None:
        self.logdir = logdir
        self._writer: Any = None
        if logdir is not None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(logdir), flush_secs=5)

    def add(self, step: int, values: Mapping[str, float | int | None]) -> None:
        if self._writer is None:
            return
        for tag, value in values.items():
            if value is not None:
                self._writer.add_scalar(tag, float(value), step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> Scalars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
