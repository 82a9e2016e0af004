"""What both transports of the Open Inference Protocol (``rest.py``, ``rpc.py``) tell about
the server and its models besides inference: the catalog of models they read, the
repository index, the server's extensions and the platform each model is reported as."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kernel.errors import RLServeError
from serve.dataplane.kinds import ModelKind
from serve.dataplane.routing import Router

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository"]
SYSTEM_SHARED_MEMORY = "system_shared_memory"  # listed only while allow_client_shm is on
PLATFORM = "onnxruntime_onnx"  # Triton's name for an ONNX model run by onnxruntime


def extensions(shared_memory: bool) -> list[str]:
    """The extensions the server metadata lists: system shared memory only when it is on."""
    return [*EXTENSIONS, SYSTEM_SHARED_MEMORY] if shared_memory else EXTENSIONS


class Catalog(Router, Protocol):
    """What the metadata routes need besides routing (``serve.control.manager``)."""

    def model_names(self) -> list[str]: ...

    def versions(self, model: str) -> list[int]:
        """The versions loaded and able to serve (NotFound for an unknown model)."""
        ...


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One model version in the repository index (both transports)."""

    name: str
    version: str
    state: str  # READY; UNAVAILABLE for a language model: this protocol does not serve it
    reason: str  # why it is not READY ("" when it is)


def _elsewhere(model: str) -> str:
    """Where a model this protocol does not serve (its calls are text, not tensors) is."""
    return f"POST /v1/models/{model}/generate (or .../score), or /v1/chat/completions"


def repository_index(catalog: Catalog) -> list[IndexEntry]:
    """Every loaded version; a language model's marked UNAVAILABLE here, with where it is
    served (its calls are text, not tensors)."""
    index = []
    for name in catalog.model_names():
        for version in catalog.versions(name):
            try:
                kind = catalog.resolve(name, version).kind
            except RLServeError:  # unloaded meanwhile: listed as the catalog has it
                kind = ModelKind.ROWS
            if kind is not ModelKind.ROWS:
                reason = f"a {kind.noun}: not served by the Open Inference Protocol; "
                index.append(
                    IndexEntry(name, str(version), "UNAVAILABLE", reason + _elsewhere(name))
                )
            else:
                index.append(IndexEntry(name, str(version), "READY", ""))
    return index
