"""Which decoder graph ``rlserve export lm`` makes (``--graph``); imported by the CLI's
argument parsing, so it imports nothing heavy."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["GraphKind"]


class GraphKind(StrEnum):
    # onnxruntime-genai's model builder: GroupQueryAttention, cache layout sequence_lengths
    # (export/lm/gqa.py). The default: on a small model it decodes a step in about half the
    # time.
    GQA = "gqa"
    # torch.onnx (dynamo): the transformers model's attention spelled out, cache layout
    # left_padded (export/lm/graph.py). Needs no onnxruntime-genai.
    TORCH = "torch"
