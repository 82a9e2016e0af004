"""onnxruntime sessions: execution providers, session options, and an honest provider report.

``providers: auto`` takes the GPU providers this onnxruntime build offers (TensorRT, then
CUDA), then CPU, and accepts whichever becomes active. An explicit list is a requirement:
when a GPU provider it names is not active in the built session (missing CUDA libraries,
no device), the session is marked ``fallback`` and the server stays unready unless
``allow_cpu_fallback`` is set. onnxruntime itself would fall back silently.

``gpu_memory_limit_bytes`` caps the CUDA provider's memory arena (``gpu_mem_limit``, grown
only by what each allocation asks for: ``arena_extend_strategy: kSameAsRequested``) and
TensorRT's workspace (``trt_max_workspace_size``), so that servers sharing one GPU cannot
starve each other; unset, onnxruntime's defaults hold (no arena limit). When onnxruntime's
own fallback rebuilds a session without its options (TensorRT failing to load, CUDA taking
over), they are set again. Its run-time fallback (a provider failing during a run moves the
session to the CPU for good) is turned off: that batch fails, and the next runs as before.

A session runs its batches one of two ways, chosen once when it is built
(:class:`Execution`): on the CPU provider ``session.run`` with numpy feeds; on CUDA or
TensorRT through an I/O binding, with the inputs copied to the device and the outputs left
there by the run and copied back to host memory once, together.

A CPU session can also run over arrays bound where they lie (:meth:`Session.bind`): the
inputs are read and the outputs written in the caller's own numpy arrays, with no copy in
or out, and an output may be bound to an input's array (a language model's key/value
cache grown in place: ``serve.lm.slots``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from kernel.errors import ModelLoadError, one_line
from serve.config import Settings

log = logging.getLogger("rlserve.runtime")

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)
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


class Execution(Enum):
    """How a session runs a batch."""

    RUN = "run"  # session.run with numpy feeds: the CPU provider reads them where they are
    BOUND = "bound"  # an I/O binding: inputs to the device, outputs back to the host once

    @classmethod
    def for_provider(cls, provider: str) -> Execution:
        return cls.BOUND if provider in GPU_PROVIDERS else cls.RUN


Executor = Callable[[dict[str, np.ndarray]], list[np.ndarray]]
# inputs and outputs bound in place -> a run over them (see Session.bind)
Binder = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], Callable[[], None]]


class Session:
    """One inference session: named inputs in, named outputs out."""

    def __init__(
        self,
        session: ort.InferenceSession,
        report: ProviderReport,
        execution: Execution | None = None,
    ) -> None:
        self._session = session
        self.report = report
        self.output_names = [o.name for o in session.get_outputs()]
        self.metadata: dict[str, str] = dict(session.get_modelmeta().custom_metadata_map)
        self.execution = execution or Execution.for_provider(report.primary)
        self._execute: Executor = (
            _BoundRun(session, self.output_names, _device_of(report.primary))
            if self.execution is Execution.BOUND
            else _PlainRun(session, self.output_names)
        )

    def provider_options(self) -> dict[str, dict[str, str]]:
        """The options each active provider was registered with, as onnxruntime reports them."""
        registered: dict[str, dict[str, str]] = self._session.get_provider_options()
        return registered

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._execute(feeds)
        return {name: _canonical(v) for name, v in zip(self.output_names, values, strict=True)}

    @property
    def binder(self) -> Binder | None:
        """:meth:`bind` where the session runs on the CPU (its arrays are host memory);
        ``None`` on a GPU provider."""
        return self.bind if self.execution is Execution.RUN else None

    def bind(
        self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> Callable[[], None]:
        """A run that reads ``inputs`` and writes ``outputs`` where they are: C-contiguous
        host arrays of the exact shapes the run takes and makes, kept alive by the binding.
        An array given both as an input and as an output is one buffer to the graph. Bind
        again whenever an array is replaced or its shape changes."""
        binding = self._session.io_binding()
        values: dict[tuple[int, tuple[int, ...]], ort.OrtValue] = {}

        def value(array: np.ndarray) -> ort.OrtValue:
            if not array.flags.c_contiguous:
                raise ValueError("a bound array must be C-contiguous")
            key = (array.ctypes.data, array.shape)
            if key not in values:
                values[key] = ort.OrtValue.ortvalue_from_numpy(array)
            return values[key]

        for name, array in inputs.items():
            binding.bind_ortvalue_input(name, value(array))
        for name, array in outputs.items():
            binding.bind_ortvalue_output(name, value(array))
        session = self._session

        def run() -> None:
            session.run_with_iobinding(binding)

        return run


class _PlainRun:
    def __init__(self, session: ort.InferenceSession, output_names: list[str]) -> None:
        self._session, self._outputs = session, output_names

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        values: list[np.ndarray] = self._session.run(self._outputs, feeds)
        return values


class _BoundRun:
    """A fresh binding per batch (batches of one session may run in several threads): the
    inputs are bound from host memory and copied to ``device`` as the run starts, the
    outputs are allocated on ``device`` by the run and copied to host memory in one go."""

    def __init__(self, session: ort.InferenceSession, output_names: list[str], device: str) -> None:
        self._session, self._outputs, self._device = session, output_names, device

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        binding = self._session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in self._outputs:
            binding.bind_output(name, self._device)
        self._session.run_with_iobinding(binding)
        values: list[np.ndarray] = binding.copy_outputs_to_cpu()
        return values


def _device_of(provider: str) -> str:
    """The device an I/O binding puts outputs on (device 0: a pod sees the GPUs it got)."""
    return "cuda" if provider in GPU_PROVIDERS else "cpu"


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


ProviderOptions = dict[str, str]


def provider_options(settings: Settings) -> dict[str, ProviderOptions]:
    """Options per execution provider, from the settings (onnxruntime takes them as strings)."""
    limit = settings.gpu_memory_limit_bytes
    if limit is None:
        return {}
    return {
        CUDA: {"gpu_mem_limit": str(limit), "arena_extend_strategy": "kSameAsRequested"},
        TENSORRT: {"trt_max_workspace_size": str(limit)},
    }


def session_providers(
    requested: tuple[str, ...], settings: Settings
) -> list[tuple[str, ProviderOptions]]:
    """The ``providers`` argument of ``InferenceSession``: each requested provider, in order,
    with its options."""
    options = provider_options(settings)
    return [(name, options.get(name, {})) for name in requested]


def create_session(
    model: Path | bytes,
    settings: Settings,
    origin: str,
    *,
    execution: Execution | None = None,
) -> Session:
    """A session on the requested providers; ``execution`` forces how batches run (default:
    an I/O binding on a GPU provider, ``session.run`` on the CPU)."""
    requested = requested_providers(settings)
    unknown = [p for p in requested if p not in ort.get_all_providers()]
    if unknown:
        raise ModelLoadError(
            f"providers: unknown execution provider(s) {unknown}; "
            f"onnxruntime knows {ort.get_all_providers()}"
        )
    source = model if isinstance(model, bytes) else str(model)
    try:
        # Only the installed providers are asked for: onnxruntime would warn about the others
        # and build on the rest anyway; the report below names what is missing.
        available = set(ort.get_available_providers())
        installed = tuple(p for p in requested if p in available) or (CPU,)
        providers: list[Any] = session_providers(installed, settings)
        session = ort.InferenceSession(source, _options(settings), providers=providers)
        # onnxruntime moves a session whose provider fails during a run to the CPU for good,
        # unseen; a failing batch should fail instead (and the next one run where it should).
        session.disable_fallback()
        _restore_options(session, settings, origin)
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
    return Session(session, ProviderReport(requested, active, missing), execution)


_LIMITS = ("gpu_mem_limit", "trt_max_workspace_size")


def lost_options(
    active: list[str],
    registered: dict[str, dict[str, str]],
    wanted: dict[str, ProviderOptions],
) -> list[str]:
    """The active providers missing a limit the settings give them. onnxruntime's own
    fallback (TensorRT failing as the session is built, e.g. without its libraries) rebuilds
    the session on CUDA and the CPU without any provider options."""
    return [
        provider
        for provider in active
        if any(
            registered.get(provider, {}).get(key) != value
            for key, value in wanted.get(provider, {}).items()
            if key in _LIMITS
        )
    ]


def _restore_options(session: ort.InferenceSession, settings: Settings, origin: str) -> None:
    wanted = provider_options(settings)
    active = list(session.get_providers())
    lost = lost_options(active, session.get_provider_options(), wanted)
    if lost:
        log.warning(
            "%s: onnxruntime fell back to %s without their options; setting %s again",
            origin,
            active,
            {p: wanted[p] for p in lost},
        )
        session.set_providers(active, [wanted.get(p, {}) for p in active])


def _options(settings: Settings) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.graph_optimization_level = _OPTIMIZATION[settings.graph_optimization_level]
    options.log_severity_level = 3  # errors only; provider fallbacks are reported by us
    return options
