"""A model's graph cut down to some of its outputs, for a second session that runs less.

onnxruntime runs every node of a graph whatever outputs a run asks for: an actor-critic's
critic runs for a request that wants only actions. :func:`cut_to` keeps the nodes the named
outputs need and the initializers those nodes read (onnx's ``Extractor``), so a session
over the cut graph reads only those weights. At batch 1 a small policy's run is bound by
reading its weights, so half the weights is close to half the run.

A graph is left whole (``None``) when the cut would keep every node, or when a node carries
a subgraph (``If``, ``Loop``, ``Scan``: their bodies may read outer values that the cut does
not follow). The caller checks the cut session against the whole one before serving from
it (``serve.policy.version``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx.utils import Extractor

_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def cut_to(model: Path, outputs: Sequence[str]) -> bytes | None:
    """The model at ``model`` with only ``outputs`` (and every input), serialized; None when
    nothing would be left out or the graph cannot be cut safely."""
    proto = onnx.load(str(model))
    graph = proto.graph
    if any(a.type in _SUBGRAPHS for node in graph.node for a in node.attribute):
        return None
    weights = {t.name for t in graph.initializer}  # older exporters list them as inputs too
    inputs = [i.name for i in graph.input if i.name not in weights]
    cut = Extractor(proto).extract_model(inputs, list(outputs))
    if len(cut.graph.node) == len(graph.node):
        return None
    return cut.SerializeToString()
