"""A custom MLServer runtime running an ONNX model with onnxruntime: the Open Inference
Protocol peer of the ``oip`` scenario (bench/oip.py).

MLServer ships no ONNX runtime; this is the least a user would write: one
``InferenceSession`` with one intra-op thread (like rlserve's and bench/raw.py's), every
input decoded with ``NumpyCodec``, every output of the graph returned. MLServer imports it
in its own virtual environment (``PYTHONPATH`` at the project root); rlserve and the
benchmark never do: the benchmark only writes model settings naming
``bench.mlserver_runtime.OnnxRuntime``.

Two shims let Triton's perf_analyzer talk to MLServer at all; neither changes what is
measured per request:

- perf_analyzer reads Triton's model configuration (``GET /v2/models/{m}/config``) before
  any load, which MLServer does not serve: a custom REST handler answers it from the file
  ``<configs>/<model>.json`` that the benchmark writes (``parameters.extra.configs``). Over
  gRPC (the ``ModelConfig`` method) there is no such hook, so perf_analyzer cannot drive
  MLServer's gRPC endpoint.
- tritonclient reads ``binary_data_size`` from any output that has ``parameters``, and
  ``NumpyCodec`` sets ``parameters.content_type``: the outputs go without parameters.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import onnxruntime as ort
from mlserver import MLModel  # type: ignore[import-not-found]
from mlserver.codecs import NumpyCodec  # type: ignore[import-not-found]
from mlserver.handlers import custom_handler  # type: ignore[import-not-found]
from mlserver.types import InferenceRequest, InferenceResponse  # type: ignore[import-not-found]

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        uri = self.settings.parameters.uri
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        self._configs = Path(self.settings.parameters.extra["configs"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        arrays = self._session.run(self._outputs, feeds)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[
                NumpyCodec.encode_output(name, array).model_copy(update={"parameters": None})
                for name, array in zip(self._outputs, arrays, strict=True)
            ],
        )

    @custom_handler(rest_path="/v2/models/{model_name}/config", rest_method="GET")
    async def config(self, model_name: str) -> dict[str, Any]:
        """Triton's model configuration of ``model_name`` (any model of the folder: every
        model registers this path and the first one answers it)."""
        if not _NAME.fullmatch(model_name):
            raise ValueError(f"no configuration for {model_name!r}")
        config: dict[str, Any] = json.loads((self._configs / f"{model_name}.json").read_text())
        return config
