"""onnxruntime sessions: execution providers, session options, and an honest provider report.

``providers: auto`` takes the GPU providers this onnxruntime build offers (TensorRT, then
CUDA), then CPU, and accepts whichever becomes active. An explicit list is a requirement:
when a GPU provider it names is not active in the built session (missing CUDA libraries,
no device), the session is marked ``fallback`` and the server stays unready unless
``allow_cpu_fallback`` is set. onnxruntime itself would fall back silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from serve.config import Settings
from serve.errors import ModelLoadError, one_line

log = logging.getLogger("rlserve.runtime")

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
CPU = "CPUExecutionProvider"
_OPTIMIZATION = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class ProviderReport:
    requested: tuple[str, ...]
    active: tuple[str, ...]
    missing: tuple[str, ...]  # requested GPU providers that are not active

    @property
    def primary(self) -> str:
        return self.active[0] if self.active else CPU


class Session:
    """One inference session: named inputs in, named outputs out."""

    def __init__(self, session: ort.InferenceSession, report: ProviderReport) -> None:
        self._session = session
        self.report = report
        self.output_names = [o.name for o in session.get_outputs()]
        self.metadata: dict[str, str] = dict(session.get_modelmeta().custom_metadata_map)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session.run(self.output_names, feeds)
        return {name: _canonical(v) for name, v in zip(self.output_names, values, strict=True)}


def _canonical(array: np.ndarray) -> np.ndarray:
    """int64 as np.int64: onnxruntime may hand back np.longlong, which JSON encoders refuse."""
    if array.dtype.kind == "i" and array.dtype.type is not np.int64:
        return array.astype(np.int64)
    return array


def requested_providers(settings: Settings) -> tuple[str, ...]:
    if settings.providers == "auto":
        available = ort.get_available_providers()
        return (*(p for p in GPU_PROVIDERS if p in available), CPU)
    return tuple(settings.providers)


def create_session(model: Path | bytes, settings: Settings, origin: str) -> Session:
    requested = requested_providers(settings)
    unknown = [p for p in requested if p not in ort.get_all_providers()]
    if unknown:
        raise ModelLoadError(
            f"providers: unknown execution provider(s) {unknown}; "
            f"onnxruntime knows {ort.get_all_providers()}"
        )
    source = model if isinstance(model, bytes) else str(model)
    try:
        session = ort.InferenceSession(source, _options(settings), providers=list(requested))
    except Exception as exc:  # onnxruntime raises assorted types for unloadable models
        raise ModelLoadError(f"{origin}: onnxruntime cannot load it ({one_line(exc)})") from None
    active = tuple(session.get_providers())
    explicit = settings.providers != "auto"
    missing = tuple(p for p in requested if p in GPU_PROVIDERS and p not in active and explicit)
    if missing:
        log.error(
            "%s: requested %s but onnxruntime runs it on %s; check CUDA/cuDNN libraries and "
            "the driver (set allow_cpu_fallback: true to serve on CPU anyway)",
            origin,
            list(missing),
            list(active),
        )
    return Session(session, ProviderReport(requested, active, missing))


def _options(settings: Settings) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.graph_optimization_level = _OPTIMIZATION[settings.graph_optimization_level]
    options.log_severity_level = 3  # errors only; provider fallbacks are reported by us
    return options
