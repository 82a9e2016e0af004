"""The benchmark policies of ``bench/models.py``, built without torch: for machines that only
have the serving install (the GPU run of ``bench/gpu.sh``).

- ``mlp``: a Humanoid-sized actor-critic as SB3's MlpPolicy lays it out (376 float
  observations, separate 256x256 tanh actor and critic, a diagonal Gaussian over 17
  actions clipped to [-0.4, 0.4]);
- ``cnn``: Nature-CNN over 4x84x84 uint8 frames (scaled by 1/255 in the graph), one shared
  512-unit feature layer, 6 discrete actions.

The graphs are written with ``onnx.helper`` (the ``onnx`` package, no torch), weights drawn
from a seeded generator (a benchmark does not depend on them; they are scaled so that the
logits are not all near zero, which would make discrete actions ties). Each file carries a
policy contract like the exporter's, with golden vectors computed by onnxruntime on the CPU,
so the server verifies the file on whatever provider it runs, as for any exported model.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernel.contract import METADATA_KEY, PolicyContract

OPSET = 18
IR_VERSION = 10  # read by every onnxruntime from 1.20 on
GOLDEN_ROWS = (1, 3)  # golden vectors: a single row and a small batch


@dataclass(frozen=True)
class GpuBenchModel:
    name: str
    observation_shape: tuple[int, ...]
    observation_dtype: str  # "float32" or "uint8"

    def observations(self, rows: int, seed: int) -> np.ndarray:
        """``rows`` seeded observations of this model's space."""
        rng = np.random.default_rng(seed)
        shape = (rows, *self.observation_shape)
        if self.observation_dtype == "uint8":
            return rng.integers(0, 256, size=shape, dtype=np.uint8)
        return rng.standard_normal(shape).astype(np.float32)


MLP = GpuBenchModel("mlp", (376,), "float32")
CNN = GpuBenchModel("cnn", (4, 84, 84), "uint8")
MODELS = (MLP, CNN)


def build_repository(root: Path, models: tuple[GpuBenchModel, ...] = MODELS) -> Path:
    """``root``/<name>/1/model.onnx for every model (kept when already there)."""
    for model in models:
        path = root / model.name / "1" / "model.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(build(model))
    return root


def build(model: GpuBenchModel, seed: int = 0) -> bytes:
    """The ONNX file of ``model``, its contract embedded."""
    builder = {"mlp": _mlp, "cnn": _cnn}.get(model.name)
    if builder is None:
        raise ValueError(f"no graph for {model.name!r}; known: {[m.name for m in MODELS]}")
    graph, contract = builder(np.random.default_rng(seed))
    onnx_model = _model(graph)
    weights = b"".join(t.raw_data for t in graph.initializer)
    unsigned = onnx_model.SerializeToString()
    golden = _golden(model, unsigned, contract)
    full = {
        **contract,
        "source": {
            "framework": "onnx.helper (bench/gpu_models.py)",
            "framework_version": _onnx().__version__,
            "checkpoint": f"random weights, seed {seed}",
            "sha256": hashlib.sha256(weights).hexdigest(),
            "policy_class": f"bench.gpu_models.{model.name}",
        },
        "golden": golden,
    }
    entry = onnx_model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, PolicyContract.model_validate(full).to_json()
    return bytes(onnx_model.SerializeToString())


# ---------------------------------------------------------------------------- graphs


def _onnx() -> Any:
    import onnx  # the only non-serving package this needs: imported when a model is built

    return onnx


class _Graph:
    """Nodes and initializers of one graph, with fresh tensor names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def constant(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        self.initializers.append(_onnx().numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str | None = None, **attrs: Any) -> str:
        out = output or self.name(op_type.lower())
        self.nodes.append(_onnx().helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def dense(
        self, x: str, fan_in: int, fan_out: int, gain: float, output: str | None = None
    ) -> str:
        weight = self.rng.standard_normal((fan_in, fan_out)) * gain / np.sqrt(fan_in)
        w = self.constant("w", weight.astype(np.float32))
        b = self.constant("b", (self.rng.standard_normal(fan_out) * 0.1).astype(np.float32))
        return self.op("Gemm", [x, w, b], output)

    def conv(self, x: str, channels_in: int, channels_out: int, kernel: int, stride: int) -> str:
        fan_in = channels_in * kernel * kernel
        weight = self.rng.standard_normal((channels_out, channels_in, kernel, kernel))
        w = self.constant("w", (weight * np.sqrt(2 / fan_in)).astype(np.float32))
        b = self.constant("b", np.zeros(channels_out, np.float32))
        return self.op("Conv", [x, w, b], kernel_shape=[kernel, kernel], strides=[stride, stride])


def _tensor(name: str, elem: int, shape: list[Any]) -> Any:
    return _onnx().helper.make_tensor_value_info(name, elem, shape)


def _mlp(rng: np.random.Generator) -> tuple[Any, dict[str, Any]]:
    onnx = _onnx()
    g = _Graph(rng)
    hidden = "obs"
    for fan_in in (376, 256):
        hidden = g.op("Tanh", [g.dense(hidden, fan_in, 256, gain=np.sqrt(2))])
    mean = g.dense(hidden, 256, 17, gain=1.0, output="mean")
    log_std = g.constant("log_std_param", (rng.standard_normal(17) * 0.1 - 0.5).astype(np.float32))
    g.op("Expand", [log_std, g.op("Shape", [mean])], "log_std")
    low = g.constant("low", np.array(-0.4, np.float32))
    high = g.constant("high", np.array(0.4, np.float32))
    g.op("Clip", [mean, low, high], "action")
    critic = "obs"
    for fan_in in (376, 256):
        critic = g.op("Tanh", [g.dense(critic, fan_in, 256, gain=np.sqrt(2))])
    value = g.dense(critic, 256, 1, gain=1.0)
    g.op("Squeeze", [value, g.constant("axis", np.array([1], np.int64))], "value")
    f = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph(
        g.nodes,
        "mlp",
        [_tensor("obs", f, ["batch", 376])],
        [
            _tensor("action", f, ["batch", 17]),
            _tensor("mean", f, ["batch", 17]),
            _tensor("log_std", f, ["batch", 17]),
            _tensor("value", f, ["batch"]),
        ],
        g.initializers,
    )
    outputs = [
        _spec("action", "action", "float32", ["batch", 17]),
        _spec("mean", "mean", "float32", ["batch", 17]),
        _spec("log_std", "log_std", "float32", ["batch", 17]),
        _spec("value", "value", "float32", ["batch"]),
    ]
    contract = _contract(
        {"type": "Box", "shape": [376], "dtype": "float32", "low": "-inf", "high": "inf"},
        {"type": "Box", "shape": [17], "dtype": "float32", "low": -0.4, "high": 0.4},
        _spec("obs", "observation", "float32", ["batch", 376]),
        outputs,
        "diag_gaussian",
        {"normalization": None, "images": [], "action_clip": True},
    )
    return graph, contract


def _cnn(rng: np.random.Generator) -> tuple[Any, dict[str, Any]]:
    onnx = _onnx()
    g = _Graph(rng)
    scaled = g.op(
        "Div",
        [
            g.op("Cast", ["obs"], to=onnx.TensorProto.FLOAT),
            g.constant("s", np.array(255.0, np.float32)),
        ],
    )
    x = g.op("Relu", [g.conv(scaled, 4, 32, 8, 4)])
    x = g.op("Relu", [g.conv(x, 32, 64, 4, 2)])
    x = g.op("Relu", [g.conv(x, 64, 64, 3, 1)])
    flat = g.op("Reshape", [x, g.constant("shape", np.array([-1, 64 * 7 * 7], np.int64))])
    features = g.op("Relu", [g.dense(flat, 64 * 7 * 7, 512, gain=np.sqrt(2))])
    logits = g.dense(features, 512, 6, gain=3.0, output="logits")
    g.op("ArgMax", [logits], "action", axis=1, keepdims=0)
    value = g.dense(features, 512, 1, gain=1.0)
    g.op("Squeeze", [value, g.constant("axis", np.array([1], np.int64))], "value")
    graph = onnx.helper.make_graph(
        g.nodes,
        "cnn",
        [_tensor("obs", onnx.TensorProto.UINT8, ["batch", 4, 84, 84])],
        [
            _tensor("action", onnx.TensorProto.INT64, ["batch"]),
            _tensor("logits", onnx.TensorProto.FLOAT, ["batch", 6]),
            _tensor("value", onnx.TensorProto.FLOAT, ["batch"]),
        ],
        g.initializers,
    )
    outputs = [
        _spec("action", "action", "int64", ["batch"]),
        _spec("logits", "logits", "float32", ["batch", 6]),
        _spec("value", "value", "float32", ["batch"]),
    ]
    images = [{"key": None, "layout": "CHW", "transposed_to_chw": False, "scale": 1 / 255}]
    contract = _contract(
        {"type": "Box", "shape": [4, 84, 84], "dtype": "uint8", "low": 0, "high": 255},
        {"type": "Discrete", "n": 6, "start": 0},
        _spec("obs", "observation", "uint8", ["batch", 4, 84, 84]),
        outputs,
        "categorical",
        {"normalization": None, "images": images, "action_clip": False},
    )
    return graph, contract


def _spec(name: str, role: str, dtype: str, shape: list[Any]) -> dict[str, Any]:
    return {"name": name, "role": role, "dtype": dtype, "shape": shape, "key": None}


def _contract(
    observation_space: dict[str, Any],
    action_space: dict[str, Any],
    observation: dict[str, Any],
    outputs: list[dict[str, Any]],
    distribution: str,
    preprocessing: dict[str, Any],
) -> dict[str, Any]:
    return {
        "schema": "rlserve.policy/v1",
        "kind": "actor_critic",
        "algorithm": "ppo",
        "observation_space": observation_space,
        "action_space": action_space,
        "inputs": [observation],
        "outputs": outputs,
        "distribution": {"kind": distribution, "nvec": None},
        "preprocessing": preprocessing,
        "policy_version": 1,
        "exporter": {"name": "rlserve", "version": "bench"},
        "opset": OPSET,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _model(graph: Any) -> Any:
    onnx = _onnx()
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _golden(
    model: GpuBenchModel, unsigned: bytes, contract: dict[str, Any]
) -> list[dict[str, Any]]:
    """Golden vectors: seeded observations and what onnxruntime on the CPU answers."""
    import onnxruntime as ort

    session = ort.InferenceSession(unsigned, providers=["CPUExecutionProvider"])
    names = [o["name"] for o in contract["outputs"]]
    golden = []
    for i, rows in enumerate(GOLDEN_ROWS):
        observations = model.observations(rows, seed=1000 + i)
        values = session.run(names, {"obs": observations})
        golden.append(
            {
                "observations": observations.tolist(),
                "outputs": {n: v.tolist() for n, v in zip(names, values, strict=True)},
            }
        )
    return golden
