"""Writing the policy contract into an ONNX model's metadata_props (and reading its opset)."""

from __future__ import annotations

import onnx

from kernel.contract import METADATA_KEY, PolicyContract


def with_contract(model_bytes: bytes, contract: PolicyContract) -> bytes:
    model = onnx.load_model_from_string(model_bytes)
    kept = [(p.key, p.value) for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    for key, value in [*kept, (METADATA_KEY, contract.to_json())]:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    return bytes(model.SerializeToString())


def default_opset(model_bytes: bytes) -> int:
    """The version of the default ONNX domain the model imports."""
    model = onnx.load_model_from_string(model_bytes)
    return next(int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx"))
