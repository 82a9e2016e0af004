"""A traced graph given new weights of its module (export/reweight.py): the same outputs as
the module, with no tracing; a graph whose tensors the exporter folded is not reweighable."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from export.onnx_export import to_onnx
from export.reweight import Reweighable


class MLP(nn.Module):
    """As the exporter's graphs are called: the inputs in order."""

    def __init__(self, bias: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = nn.Linear(4, 8), nn.Linear(8, 2)
        with torch.no_grad():
            self.first.bias.fill_(bias)
            self.second.bias.fill_(bias)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(inputs[0])))


def mlp(bias: float) -> MLP:
    return MLP(bias)


def traced(net: nn.Module) -> bytes:
    return to_onnx(net, [torch.zeros(2, 4)], ["obs"], ["out"])


def outputs(model: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"obs": x})[0])


def test_new_weights_give_the_modules_outputs_without_tracing() -> None:
    net = mlp(bias=0.1)
    graph = Reweighable.of(traced(net), net)
    assert graph is not None
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.add_(torch.randn_like(parameter))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    expected = net(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(outputs(graph.with_weights(net), x), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(outputs(graph.model, x), expected)  # the old weights, unchanged


def test_a_graph_whose_zero_biases_were_folded_away_is_not_reweighable() -> None:
    net = mlp(bias=0.0)
    assert Reweighable.of(traced(net), net) is None  # its biases are not in the graph
    other = mlp(bias=0.1)
    assert Reweighable.of(traced(other), net) is None  # values that are not the module's
