"""What a causal-LM directory holds, read from its JSON files before any weights are loaded.

A directory is either a full model (``config.json`` and weights) or a PEFT adapter
(``adapter_config.json``), which is merged into its base: ``--base``, else the adapter
config's ``base_model_name_or_path`` when that is a local directory. Architectures the
exporter cannot handle, and adapters it cannot merge, are refused here by name, and so is a
directory with a link that leads out of it (``export.lm.confinement``), before anything in
it is read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.errors import ExportError
from export.lm import confinement
from kernel.lm.contract import SIDE_FILES

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
MERGEABLE_ADAPTERS = ("LORA",)
CONFIG_FILE = "config.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "adapter_model*.bin")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelDir:
    """A full causal-LM directory: its config and weights files."""

    path: Path
    architecture: str
    config: dict[str, Any]
    weights: tuple[Path, ...]  # in name order

    def sha256(self) -> str:
        return sha256_of_files(self.weights)


@dataclass(frozen=True)
class AdapterDir:
    """A PEFT adapter directory and the base it is merged into."""

    path: Path
    kind: str  # peft_type, lower case: "lora"
    weights: tuple[Path, ...]
    base: ModelDir

    def sha256(self) -> str:
        return sha256_of_files(self.weights)


@dataclass(frozen=True)
class SideFile:
    """A file copied beside the exported model, as it was read."""

    path: Path
    data: bytes


@dataclass(frozen=True)
class Checkpoint:
    """The directory as given, and where the model's config, weights and side files are."""

    path: Path
    model: ModelDir  # the full model, or the adapter's base
    adapter: AdapterDir | None

    def side_files(self) -> dict[str, SideFile]:
        """The tokenizer, generation and chat-template files (``SIDE_FILES``) there are, each
        the given directory's, else the base's; read once, and only from inside them."""
        found: dict[str, SideFile] = {}
        for name in SIDE_FILES:
            for directory, what in ((self.path, "CHECKPOINT_DIR"), (self.model.path, "base")):
                if (directory / name).is_file():
                    path = directory / name
                    found[name] = SideFile(path, confinement.read_inside(path, directory, what))
                    break
        return found


def inspect(path: Path, base: Path | None) -> Checkpoint:
    """The checkpoint directory's layout; ExportError names what is missing or unsupported."""
    if not path.is_dir():
        problem = "is a file" if path.exists() else "no such directory"
        raise ExportError(
            f"CHECKPOINT_DIR {path}: {problem}; give the directory a transformers or TRL "
            "trainer saved (config.json and model.safetensors, or a PEFT adapter's "
            "adapter_config.json)"
        )
    confinement.check_directory(path, "CHECKPOINT_DIR")
    if (path / ADAPTER_CONFIG_FILE).is_file():
        adapter = _adapter(path, base)
        return Checkpoint(path=path, model=adapter.base, adapter=adapter)
    if base is not None:
        raise ExportError(
            f"--base {base}: {path} is a full model (no {ADAPTER_CONFIG_FILE}); --base is "
            "only for a PEFT adapter directory"
        )
    return Checkpoint(path=path, model=model_dir(path, "CHECKPOINT_DIR"), adapter=None)


def model_dir(path: Path, what: str) -> ModelDir:
    config = _json(path / CONFIG_FILE, what, "the model's config.json")
    architecture = _architecture(config, path)
    _check_attention_layers(config, path)
    weights = _weights(path, "model weights (model.safetensors)")
    return ModelDir(path=path, architecture=architecture, config=config, weights=weights)


def sha256_of_files(files: tuple[Path, ...]) -> str:
    """One digest over the files' bytes in order (a single file's own sha256)."""
    digest = hashlib.sha256()
    for file in files:
        with file.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _adapter(path: Path, base: Path | None) -> AdapterDir:
    config = _json(path / ADAPTER_CONFIG_FILE, "CHECKPOINT_DIR", "the adapter's config")
    kind = str(config.get("peft_type", "")).upper()
    if kind not in MERGEABLE_ADAPTERS:
        raise ExportError(
            f"{path / ADAPTER_CONFIG_FILE}: peft_type {config.get('peft_type')!r} cannot be "
            f"merged by this exporter; supported: {', '.join(MERGEABLE_ADAPTERS)}"
        )
    base_dir = _base_dir(path, base, config.get("base_model_name_or_path"))
    confinement.check_directory(base_dir, "--base" if base is not None else "the adapter's base")
    return AdapterDir(
        path=path,
        kind=kind.lower(),
        weights=_weights(path, "adapter weights (adapter_model.safetensors)"),
        base=model_dir(base_dir, "--base"),
    )


def _base_dir(path: Path, given: Path | None, recorded: object) -> Path:
    if given is not None:
        if not given.is_dir():
            raise ExportError(
                f"--base {given}: no such directory; give the base model's directory (the "
                "one the adapter was trained on, with config.json and model.safetensors)"
            )
        return given
    if isinstance(recorded, str) and recorded and Path(recorded).is_dir():
        return Path(recorded)
    raise ExportError(
        f"{path} is a PEFT adapter whose base model {recorded!r} (base_model_name_or_path "
        "in adapter_config.json) is not a local directory; give the base model's directory "
        "with --base DIR (nothing is downloaded)"
    )


def _architecture(config: dict[str, Any], path: Path) -> str:
    names = config.get("architectures") or []
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    if not isinstance(names, list) or len(names) != 1:
        raise ExportError(
            f"{path / CONFIG_FILE}: architectures is {names!r}; expected one of {supported}"
        )
    name = str(names[0])
    if name not in SUPPORTED_ARCHITECTURES:
        raise ExportError(
            f"{path / CONFIG_FILE}: architecture {name} is not supported by the "
            f"language-model exporter; supported: {supported}"
        )
    return name


def _check_attention_layers(config: dict[str, Any], path: Path) -> None:
    """Every layer must attend to the whole context: the graph has no sliding window."""
    layer_types = config.get("layer_types") or []
    windowed = sorted({t for t in layer_types if t != "full_attention"})
    if windowed or config.get("use_sliding_window"):
        raise ExportError(
            f"{path / CONFIG_FILE}: layers with {', '.join(windowed) or 'sliding_window'} "
            "attention are not supported (use_sliding_window must be false); the exported "
            "graph attends to the whole context"
        )


def _weights(path: Path, what: str) -> tuple[Path, ...]:
    for pattern in _WEIGHT_PATTERNS:
        found = sorted(p for p in path.glob(pattern) if p.is_file())
        if found:
            return tuple(found)
    raise ExportError(f"{path}: no {what} found; give a directory that save_pretrained wrote")


def _json(path: Path, what: str, expected: str) -> dict[str, Any]:
    if not path.is_file():
        raise ExportError(
            f"{what} {path.parent}: has no {path.name}; give a directory with {expected}"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ExportError(f"{path}: expected a JSON object")
    return raw
