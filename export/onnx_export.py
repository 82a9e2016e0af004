"""torch.onnx.export (the dynamo exporter) with a dynamic batch axis, quietly."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from export.errors import ExportError

OPSET = 18
_CHATTY_LOGGERS = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")


def to_onnx(
    graph: nn.Module, example: list[Tensor], input_names: list[str], output_names: list[str]
) -> bytes:
    """The serialised ONNX model; ``example`` holds a batch of 2 so the batch stays dynamic."""
    batch = torch.export.Dim("batch")
    dynamic = {"inputs": tuple({0: batch} for _ in example)}
    graph.eval()
    try:
        with quiet(), torch.no_grad():
            program = torch.onnx.export(
                graph,
                tuple(example),
                dynamo=True,
                opset_version=OPSET,
                dynamic_shapes=dynamic,
                input_names=input_names,
                output_names=output_names,
                verbose=False,
            )
    except Exception as exc:  # the exporter raises many types; all mean "could not trace"
        raise ExportError(
            f"torch.onnx.export could not convert the policy: {_first_line(_root(exc))}; "
            "the policy's forward pass must be traceable by torch.export"
        ) from None
    if program is None:
        raise ExportError("torch.onnx.export returned no program; upgrade torch to >= 2.5")
    return bytes(program.model_proto.SerializeToString())


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Silence the exporter's progress prints, warnings and log lines."""
    captured = io.StringIO()
    loggers = [logging.getLogger(name) for name in _CHATTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(captured),
            contextlib.redirect_stderr(captured),
        ):
            warnings.simplefilter("ignore")
            yield captured
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _root(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
