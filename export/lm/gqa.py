"""The decoder graph with GroupQueryAttention: onnxruntime-genai's model builder, fp32, CPU.

onnxruntime's ``GroupQueryAttention`` runs a layer's attention, rotary embedding and cache
update in one node (the ``torch.onnx`` graph of ``export/lm/graph.py`` spells them out in
about 150 small nodes, and on a small model their overhead is most of a decoding step). Its
cache layout is ``sequence_lengths`` (``kernel.lm.contract.CacheLayout``): a row's tokens are
its first ``sum(attention_mask)`` columns, positions come from that count (no
``position_ids`` input), and a step writes each row's new key and value at its own length.
So rows of any lengths still decode in one call.

The builder (``python -m onnxruntime_genai.models.builder``; its Python entry wants its own
option parsing first) reads a Hugging Face directory: the model given (an adapter already
merged into it) is saved to a scratch directory with its tokenizer, built there, and the
graph read back into one file. Its tensors are the contract's default names; anything else
is refused by name. The parity gate judges it like any graph.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from export.errors import ExportError
from kernel.lm.contract import DecoderTensors

# Architectures the builder is asked for, by the name the model's config gives.
FAMILIES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
TENSORS = DecoderTensors(position_ids=None)
BUILD_TIMEOUT_S = 1800.0
# The builder's names for the dynamic sizes -> the contract's (kernel.lm.contract).
_DIMS = {
    "batch_size": "batch",
    "sequence_length": "sequence",
    "past_sequence_length": "past",
    "total_sequence_length": "total",
}
_ONE_FILE_BYTES = 1_800_000_000  # below protobuf's 2 GB limit: weights inside model.onnx


class BuiltGraph:
    """The builder's graph: saved for parity, then again with the contract in its metadata
    (what ``export.lm.graph.DecoderGraph`` offers for the ``torch.onnx`` one)."""

    def __init__(self, model: Any) -> None:
        self._model = model  # onnx.ModelProto, weights loaded

    def save(self, path: Path) -> None:
        """``path`` (weights inside; over ~2 GB in ``path.data`` beside it)."""
        import onnx

        large = self._model.ByteSize() > _ONE_FILE_BYTES
        onnx.save_model(
            self._model,
            str(path),
            save_as_external_data=large,
            all_tensors_to_one_file=True,
            location=f"{path.name}.data",
        )

    def set_metadata(self, key: str, value: str) -> None:
        props = self._model.metadata_props
        for prop in props:
            if prop.key == key:
                prop.value = value
                return
        entry = props.add()
        entry.key, entry.value = key, value

    @property
    def opset(self) -> int:
        default = (o for o in self._model.opset_import if o.domain in ("", "ai.onnx"))
        return next((int(o.version) for o in default), 0)

    def mismatched_weights(self, model: Any) -> list[str]:
        """The graph's weights that ``model``'s do not give exactly, by the builder's layout
        (:func:`builder_weights`), or that it leaves unnamed: empty when a graph of other
        weights of the same architecture is this one with them (:meth:`with_weights`)."""
        from onnx import numpy_helper

        wanted = builder_weights(model)
        wrong = []
        for tensor in self._model.graph.initializer:
            given = wanted.get(tensor.name)
            if given is None:
                if tensor.name not in _FIXED:
                    wrong.append(tensor.name)
                continue
            held = numpy_helper.to_array(tensor)
            if held.shape != given.shape or not np.array_equal(held, given):
                wrong.append(tensor.name)
        return wrong

    def with_weights(self, model: Any) -> BuiltGraph:
        """A copy of this graph holding ``model``'s weights (the same architecture and
        sizes): what the builder would build for it, in milliseconds instead of seconds.
        Sound only for a graph whose :meth:`mismatched_weights` was empty for its own
        model; the parity gate judges the copy like any graph."""
        import onnx
        from onnx import numpy_helper

        wanted = builder_weights(model)
        copy = onnx.ModelProto()
        copy.CopyFrom(self._model)
        for tensor in copy.graph.initializer:
            given = wanted.get(tensor.name)
            if given is None:
                continue
            if tuple(tensor.dims) != given.shape:
                raise ExportError(
                    f"weight {tensor.name}: the graph holds {list(tensor.dims)}, the model "
                    f"{list(given.shape)}; build the graph again for this model"
                )
            tensor.CopyFrom(numpy_helper.from_array(given, tensor.name))
        return BuiltGraph(copy)


_FIXED = {"cos_cache", "sin_cache"}  # the rotary tables: the config's, not weights


def builder_weights(model: Any) -> dict[str, np.ndarray]:
    """``model``'s weights as the builder lays them out for Llama and Qwen2, by its names:
    projections as ``MatMul`` right-hand sides (transposed), a layer's query, key and value
    projections packed into one (and their biases), the final norm after the last layer."""
    state = {name: value.detach().float().numpy() for name, value in model.state_dict().items()}
    layers = int(model.config.num_hidden_layers)
    out = {"lm_head.MatMul.weight": state["lm_head.weight"].T}
    if not getattr(model.config, "tie_word_embeddings", False):
        out["model.embed_tokens.weight"] = state["model.embed_tokens.weight"]
    out[f"model.layers.{layers}.final_norm_layernorm.weight"] = state["model.norm.weight"]
    for i in range(layers):
        ours, theirs = f"model.layers.{i}", f"model.layers.{i}"
        attention = f"{theirs}.self_attn"
        packed = [state[f"{attention}.{p}_proj.weight"] for p in "qkv"]
        out[f"{ours}.attn.qkv_proj.MatMul.weight"] = np.concatenate(packed).T
        if f"{attention}.q_proj.bias" in state:
            biases = [state[f"{attention}.{p}_proj.bias"] for p in "qkv"]
            out[f"{ours}.attn.qkv_proj.Add.bias"] = np.concatenate(biases)
        out[f"{ours}.attn.o_proj.MatMul.weight"] = state[f"{attention}.o_proj.weight"].T
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{ours}.{norm}.weight"] = state[f"{theirs}.{norm}.weight"]
        for projection in ("gate_proj", "up_proj", "down_proj"):
            weight = state[f"{theirs}.mlp.{projection}.weight"]
            out[f"{ours}.mlp.{projection}.MatMul.weight"] = weight.T
    return {name: np.ascontiguousarray(value, np.float32) for name, value in out.items()}


def export(model: Any, tokenizer: Any) -> BuiltGraph:
    """The builder's graph of ``model`` (a transformers causal LM, float32)."""
    import onnx

    architecture = type(model).__name__
    family = FAMILIES.get(architecture)
    if family is None:
        raise ExportError(
            f"the GroupQueryAttention graph is built for {sorted(FAMILIES)}, not {architecture}"
        )
    with tempfile.TemporaryDirectory(prefix="rlserve-gqa-") as scratch:
        root = Path(scratch)
        source, built = root / "source", root / "built"
        model.save_pretrained(source)
        tokenizer.save_pretrained(source)
        command = [
            sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", family,
            "-i", str(source), "-o", str(built), "-p", "fp32", "-e", "cpu",
            "-c", str(root / "cache"),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExportError(f"onnxruntime-genai's model builder did not run: {exc}") from None
        graph = built / "model.onnx"
        if done.returncode != 0 or not graph.is_file():
            tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-3:]
            raise ExportError(
                f"onnxruntime-genai's model builder failed (exit {done.returncode}): {tail}; "
                "is onnxruntime-genai installed (pip install onnxruntime-genai)?"
            )
        proto = onnx.load_model(str(graph), load_external_data=True)
    _check_interface(proto, int(model.config.num_hidden_layers))
    _name_dims(proto, _head_dim(model.config))
    return BuiltGraph(proto)


def _head_dim(config: Any) -> int:
    heads = int(config.num_attention_heads)
    return int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)


def _name_dims(proto: Any, head_dim: int) -> None:
    """The graph's dynamic sizes under the contract's names, the head size fixed."""
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "kv_cache_dim":
                dim.dim_value = head_dim
            elif dim.dim_param in _DIMS:
                dim.dim_param = _DIMS[dim.dim_param]


def _check_interface(proto: Any, layers: int) -> None:
    """The builder's tensors must be the contract's names (TENSORS)."""
    t = TENSORS
    cache_in = [n.format(i=i) for i in range(layers) for n in (t.past_key, t.past_value)]
    cache_out = [n.format(i=i) for i in range(layers) for n in (t.present_key, t.present_value)]
    inputs = {i.name for i in proto.graph.input}
    outputs = {o.name for o in proto.graph.output}
    wanted_in = {t.input_ids, t.attention_mask, *cache_in}
    wanted_out = {t.logits, *cache_out}
    if inputs != wanted_in or not wanted_out <= outputs:
        raise ExportError(
            f"onnxruntime-genai's graph has inputs {sorted(inputs)} and outputs "
            f"{sorted(outputs)}; expected inputs {sorted(wanted_in)} and outputs "
            f"{sorted(wanted_out)}"
        )
