"""A graph cut down to some of its outputs (serve.execution.graph_cut), run by onnxruntime."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from serve.execution.graph_cut import cut_to

RNG = np.random.default_rng(0)


def _two_heads(path: Path) -> Path:
    """x -> Relu(x @ w) -> two heads: actor (@ a) and critic (@ c)."""
    weights = {
        "w": RNG.standard_normal((4, 8)),
        "a": RNG.standard_normal((8, 2)),
        "c": RNG.standard_normal((8, 1)),
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h0"]),
            helper.make_node("Relu", ["h0"], ["h"]),
            helper.make_node("MatMul", ["h", "a"], ["action"]),
            helper.make_node("MatMul", ["h", "c"], ["value"]),
        ],
        "two_heads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch", 1]),
        ],
        initializer=[
            numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_cut_keeps_only_the_nodes_and_weights_its_outputs_need(tmp_path: Path) -> None:
    model = _two_heads(tmp_path / "model.onnx")
    cut = cut_to(model, ["action"])
    assert cut is not None
    proto = onnx.load_from_string(cut)
    assert [n.op_type for n in proto.graph.node] == ["MatMul", "Relu", "MatMul"]
    assert sorted(t.name for t in proto.graph.initializer) == ["a", "w"]
    x = {"x": RNG.standard_normal((5, 4)).astype(np.float32)}
    whole = ort.InferenceSession(str(model)).run(["action"], x)[0]
    (action,) = ort.InferenceSession(cut).run(None, x)
    assert np.array_equal(action, whole)


def test_a_graph_whose_outputs_need_every_node_is_left_whole(tmp_path: Path) -> None:
    model = _two_heads(tmp_path / "model.onnx")
    assert cut_to(model, ["action", "value"]) is None


def test_a_graph_with_subgraphs_is_left_whole(tmp_path: Path) -> None:
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "branch",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["positive"]),
            helper.make_node(
                "If", ["positive"], ["chosen"], then_branch=branch, else_branch=branch
            ),
            helper.make_node("Neg", ["x"], ["other"]),
        ],
        "with_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("chosen", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("other", TensorProto.FLOAT, ["batch", 4]),
        ],
        initializer=[numpy_helper.from_array(np.zeros((), np.float32), "zero")],
    )
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert cut_to(path, ["chosen"]) is None
