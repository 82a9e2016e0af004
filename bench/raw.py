"""Raw onnxruntime: the ceiling a server on the same model can approach."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from kernel import contract
from kernel.spaces import sample


def rows_per_second(model: Path, batch: int, seconds: float = 2.0) -> float:
    """Rows per second of back-to-back session.run calls on one thread, one intra-op thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    space = contract.read(model).observation_space
    feeds = {session.get_inputs()[0].name: sample(space, np.random.default_rng(0), batch)}  # type: ignore[arg-type]
    session.run(None, feeds)
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(None, feeds)
        runs += 1
    return runs * batch / (time.perf_counter() - started)
