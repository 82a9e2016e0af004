"""Which trainer wrote a directory, from what TRL leaves beside the weights.

TRL's ``save_model`` writes a model card (``README.md``) whose metadata tags name the
trainer (``trl``, ``dpo`` / ``grpo``) and whose body names the TRL version, and
``training_args.bin``, a pickle of the trainer's config (``DPOConfig``, ``GRPOConfig``).
The pickle is only scanned for those class names, never unpickled.
"""

from __future__ import annotations

import pickletools
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kernel.contract import Algorithm

MODEL_CARD = "README.md"
TRAINING_ARGS = "training_args.bin"
_TAGS = {Algorithm.DPO: "dpo", Algorithm.GRPO: "grpo"}
_CONFIG_CLASSES = {Algorithm.DPO: "DPOConfig", Algorithm.GRPO: "GRPOConfig"}
_TRL_VERSION = re.compile(r"^\s*-\s*TRL:\s*(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Training:
    algorithm: Algorithm | None  # None: nothing in the directory says
    trainer: str | None  # e.g. "trl 1.16.0"
    evidence: str | None  # where the algorithm was read, for the progress line


def detect(directory: Path) -> Training:
    """The algorithm and trainer, from the model card, else from the training arguments."""
    tags, trl_version = _model_card(directory / MODEL_CARD)
    trainer = f"trl {trl_version}" if trl_version else ("trl" if "trl" in tags else None)
    for algorithm, tag in _TAGS.items():
        if tag in tags:
            return Training(algorithm, trainer, f"{MODEL_CARD} tag {tag!r}")
    classes = _pickled_names(directory / TRAINING_ARGS)
    for algorithm, name in _CONFIG_CLASSES.items():
        if name in classes:
            return Training(algorithm, trainer or "trl", f"{TRAINING_ARGS} holds a {name}")
    return Training(None, trainer, None)


def _model_card(path: Path) -> tuple[set[str], str | None]:
    if not path.is_file():
        return set(), None
    from huggingface_hub.repocard import metadata_load

    try:
        text = path.read_text(encoding="utf-8")
        metadata = metadata_load(path) or {}
    except (OSError, UnicodeDecodeError, ValueError):
        return set(), None
    tags = metadata.get("tags") or []
    found = _TRL_VERSION.search(text)
    return {str(t).lower() for t in tags if isinstance(t, str)}, found.group(1) if found else None


def _pickled_names(path: Path) -> set[str]:
    """The strings a torch.save pickle names (module and class names among them)."""
    if not path.is_file():
        return set()
    try:
        with zipfile.ZipFile(path) as archive:
            data = next(
                (archive.read(n) for n in archive.namelist() if n.endswith("data.pkl")), b""
            )
        strings = [arg for _, arg, _ in pickletools.genops(data) if isinstance(arg, str)]
        return {word for text in strings for word in text.split()}  # GLOBAL: "module Class"
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return set()
