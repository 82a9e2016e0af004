"""The decoder graph: a transformers causal LM as one ONNX step function with a flat KV cache.

The wrapper takes exactly the contract's inputs (``input_ids``, ``attention_mask [B, total]``,
``position_ids [B, S]``, ``past_key_values.{i}.key/value``) and returns ``logits`` and
``present.{i}.key/value``. It builds the 4-D additive mask itself from the 2-D one (a query
in column ``total - S + j`` sees the columns up to its own that the mask keeps), so rows may
be left-padded and ``position_ids`` may count real tokens only; and it wraps the past tensors
in the ``DynamicCache`` transformers wants. ``total`` is its own dynamic dimension, not
``past + sequence``. Past length 0 (a prefill) works.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from export.errors import ExportError
from export.onnx_export import quiet
from kernel.errors import one_line
from kernel.lm.contract import DecoderTensors

OPSET = 18
_EXAMPLE = {"batch": 2, "sequence": 3, "past": 4}  # sizes 0 and 1 would be specialised


@dataclass(frozen=True)
class CacheShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: Any) -> CacheShape:
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(int(config.num_hidden_layers), int(kv_heads), int(head_dim))


class DecoderStep(nn.Module):
    """(input_ids, attention_mask, position_ids, *past) -> (logits, *present)."""

    def __init__(self, model: nn.Module, shape: CacheShape) -> None:
        super().__init__()
        self.model = model
        self.num_layers = shape.num_layers

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *past: Tensor
    ) -> tuple[Tensor, ...]:
        from transformers import DynamicCache

        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)]
        cache = DynamicCache(ddp_cache_data=pairs)
        out = self.model(
            input_ids=input_ids,
            attention_mask=additive_mask(attention_mask, input_ids.shape[1]),
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        present: list[Tensor] = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def additive_mask(attention_mask: Tensor, sequence: int) -> Tensor:
    """[B, total] of 1/0 -> [B, 1, S, total] of 0 / float32 min: causal and padding at once."""
    total = attention_mask.shape[1]
    queries = torch.arange(sequence, device=attention_mask.device) + (total - sequence)
    keys = torch.arange(total, device=attention_mask.device)
    causal = keys[None, :] <= queries[:, None]
    allowed = causal[None, None, :, :] & attention_mask[:, None, None, :].bool()
    blocked = torch.tensor(torch.finfo(torch.float32).min, dtype=torch.float32)
    return torch.where(allowed, torch.tensor(0.0, dtype=torch.float32), blocked)


def input_names(tensors: DecoderTensors, num_layers: int) -> list[str]:
    cache = [
        name.format(i=i)
        for i in range(num_layers)
        for name in (tensors.past_key, tensors.past_value)
    ]
    positions = tensors.position_ids or "position_ids"  # this graph always takes them
    return [tensors.input_ids, tensors.attention_mask, positions, *cache]


def output_names(tensors: DecoderTensors, num_layers: int) -> list[str]:
    cache = [
        name.format(i=i)
        for i in range(num_layers)
        for name in (tensors.present_key, tensors.present_value)
    ]
    return [tensors.logits, *cache]


class DecoderGraph:
    """The exported program: saved for parity, then again with the contract in its metadata."""

    def __init__(self, program: Any) -> None:
        self._program = program

    def save(self, path: Path) -> None:
        """``path`` (weights inside; over 2 GB torch writes ``path.data`` beside it)."""
        self._program.save(str(path))

    def set_metadata(self, key: str, value: str) -> None:
        self._program.model.metadata_props[key] = value

    @property
    def opset(self) -> int:
        return int(self._program.model.opset_imports.get("", OPSET))


def export(model: Any, tensors: DecoderTensors) -> DecoderGraph:
    """torch.onnx.export (dynamo) of the step function with dynamic batch, sequence, past and
    total; present tensors' length is named ``total`` in the graph."""
    shape = CacheShape.of(model.config)
    step = DecoderStep(model, shape).eval()
    batch, sequence, past = (torch.export.Dim(n) for n in ("batch", "sequence", "past"))
    total = torch.export.Dim("total")
    cache_dims = tuple({0: batch, 2: past} for _ in range(2 * shape.num_layers))
    dynamic = ({0: batch, 1: sequence}, {0: batch, 1: total}, {0: batch, 1: sequence}, cache_dims)
    try:
        with quiet(), torch.no_grad():
            program = torch.onnx.export(
                step,
                _example(shape, int(model.config.vocab_size)),
                dynamo=True,
                opset_version=OPSET,
                dynamic_shapes=dynamic,
                input_names=input_names(tensors, shape.num_layers),
                output_names=output_names(tensors, shape.num_layers),
                verbose=False,
            )
    except Exception as exc:  # the exporter raises many types; all mean "could not trace"
        raise ExportError(
            f"torch.onnx.export could not convert the decoder: {one_line(_root(exc))}"
        ) from None
    if program is None:
        raise ExportError("torch.onnx.export returned no program; upgrade torch to >= 2.5")
    _name_present_length(program, tensors)
    return DecoderGraph(program)


def _example(shape: CacheShape, vocab_size: int) -> tuple[Any, ...]:
    b, s, p = _EXAMPLE["batch"], _EXAMPLE["sequence"], _EXAMPLE["past"]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (b, s), generator=generator)
    mask = torch.ones(b, p + s, dtype=torch.long)
    positions = torch.arange(p, p + s).repeat(b, 1)
    cache = tuple(
        torch.randn(b, shape.num_kv_heads, p, shape.head_dim, generator=generator)
        for _ in range(2 * shape.num_layers)
    )
    return (ids, mask, positions, *cache)


def _name_present_length(program: Any, tensors: DecoderTensors) -> None:
    """``past + sequence`` in the present tensors' shapes becomes ``total``, as the contract
    documents them (the same length as attention_mask's second axis)."""
    import onnx_ir as ir

    prefixes = (tensors.present_key.split("{i}")[0], tensors.present_value.split("{i}")[0])
    for value in program.model.graph.outputs:
        if value.name.startswith(prefixes) and value.shape is not None:
            dims = list(value.shape)
            dims[2] = ir.SymbolicDim("total")
            value.shape = ir.Shape(dims)


def _root(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc
