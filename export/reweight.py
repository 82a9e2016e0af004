"""An exported graph given other weights of the module it was exported from.

A trainer exports a new version of the same network after every update; tracing it with
``torch.onnx`` again costs most of a second for a small MLP, while only the weights have
changed. :meth:`Reweighable.of` says whether a graph can take new weights as they are: every
floating-point initializer of the graph is one of the module's tensors, by its name in
``state_dict`` and exactly its value, and every floating-point tensor of the module is
there. A tensor the exporter folded away (a zero bias, a normalisation's statistics merged
into a constant) or transformed makes the graph not reweighable (None), and the exporter
builds the next graph from scratch, as before. The parity gate judges a reweighted graph
like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

_FLOATS = {1, 10, 11, 16}  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass(frozen=True)
class Reweighable:
    """A graph (its serialised bytes) whose named initializers are its module's tensors."""

    model: bytes
    names: tuple[str, ...]  # the initializers that are the module's tensors, by state_dict key

    @classmethod
    def of(cls, model: bytes, module: nn.Module) -> Reweighable | None:
        import onnx
        from onnx import numpy_helper

        proto = onnx.load_from_string(model)
        state = _floating(module)
        names = []
        for tensor in proto.graph.initializer:
            if tensor.data_type not in _FLOATS:
                continue
            value = state.get(tensor.name)
            if value is None:
                return None  # a constant the exporter made: it may depend on the weights
            held = numpy_helper.to_array(tensor)
            if held.shape != value.shape or not np.array_equal(held, value.astype(held.dtype)):
                return None
            names.append(tensor.name)
        if set(names) != set(state):
            return None  # a tensor of the module folded into the graph's arithmetic
        return cls(model, tuple(names))

    def with_weights(self, module: nn.Module) -> bytes:
        """The graph holding ``module``'s current values of its tensors."""
        import onnx
        from onnx import numpy_helper

        proto = onnx.load_from_string(self.model)
        state = _floating(module)
        wanted = set(self.names)
        for tensor in proto.graph.initializer:
            if tensor.name in wanted:
                dtype = numpy_helper.to_array(tensor).dtype
                tensor.CopyFrom(
                    numpy_helper.from_array(state[tensor.name].astype(dtype), tensor.name)
                )
        return bytes(proto.SerializeToString())


def _floating(module: nn.Module) -> dict[str, np.ndarray]:
    return {
        name: value.detach().cpu().numpy()
        for name, value in module.state_dict().items()
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    }
