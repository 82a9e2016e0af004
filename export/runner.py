"""onnxruntime on the CPU as parity and the golden checks call it: feeds by name in, outputs
by name out. Every source's pipeline runs its candidate and its written file through it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def runner(model: bytes | Path) -> Runner:
    """An onnxruntime session on the CPU, returning its outputs by name."""
    target = str(model) if isinstance(model, Path) else model
    session = ort.InferenceSession(target, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    return run
