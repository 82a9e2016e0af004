"""One record per executed batch: the single product of a run.

The scheduler builds a :class:`BatchRecord` after every batch and hands it, on the event
loop, to each :class:`RecordSink`: the metrics (``serve.metrics.MetricsSink``), and any
sink a deployment adds (the experience stream of RL training plugs in here). Responses are
cut from the same record, so what a client receives, what the metrics count and what a
sink stores are one and the same run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from serve.dataplane.messages import Prepared


@dataclass(frozen=True, slots=True)
class BatchRecord:
    model: str
    version: int
    sha256: str
    request_ids: tuple[str, ...]
    requests: tuple[Prepared, ...]  # in row order; request i owns rows offsets[i]:offsets[i+1]
    offsets: tuple[int, ...]  # len(requests) + 1 row offsets
    inputs: dict[str, np.ndarray]  # graph input name -> every row (unpadded)
    outputs: dict[str, np.ndarray]  # graph outputs and policy heads -> every row
    received_at: tuple[float, ...]  # per request, monotonic seconds
    enqueued_at: tuple[float, ...]  # per request
    started_at: float  # the batch began to run
    finished_at: float  # outputs were ready
    max_rows: int  # the scheduler's max_batch_size

    @property
    def rows(self) -> int:
        return self.offsets[-1]

    @property
    def run_s(self) -> float:
        return self.finished_at - self.started_at


class RecordSink(Protocol):
    """Receives every executed batch, on the event loop, right after it ran.

    ``accept`` must return quickly (buffer and ship elsewhere); an exception it raises is
    logged and does not affect the batch's answers.
    """

    def accept(self, record: BatchRecord) -> None: ...
