"""Resolving ``MODULE_OR_FILE:ATTR`` to a torch module, and loading a state_dict into it.

MODULE is an importable module name (the current directory is searched first) or a ``.py``
file; ATTR names an ``nn.Module`` instance or a zero-argument factory (a class or function)
returning one. Importing runs the module's top-level code: keep training behind
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from export.errors import ExportError
from export.files import require_file

_FORM = "MODULE_OR_FILE:ATTR, e.g. 'agents.cartpole:Agent' or 'agent.py:make_agent'"


def resolve(target: str) -> nn.Module:
    module_part, _, attribute = target.rpartition(":")
    if not module_part or not attribute:
        raise ExportError(f"target {target!r}: expected {_FORM}")
    found = _attribute(_import(module_part), attribute, target)
    instance = found if isinstance(found, nn.Module) else _call_factory(found, target)
    if not isinstance(instance, nn.Module):
        raise ExportError(
            f"target {target!r}: gave a {type(instance).__name__}, not a torch.nn.Module; "
            "name an nn.Module instance or a zero-argument factory returning one"
        )
    return instance


def load_state_dict(module: nn.Module, path: Path) -> None:
    require_file(path, "--checkpoint", "a state_dict saved with torch.save(model.state_dict())")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors
        raise ExportError(
            f"--checkpoint {path}: not loadable with torch.load(weights_only=True) "
            f"({_one_line(exc)}); save only the state_dict: torch.save(model.state_dict(), path)"
        ) from None
    if not isinstance(state, dict):
        raise ExportError(
            f"--checkpoint {path}: holds a {type(state).__name__}, not a state_dict; "
            "save it with torch.save(model.state_dict(), path)"
        )
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ExportError(
            f"--checkpoint {path}: does not fit the module ({_one_line(exc)})"
        ) from None


def _import(module_part: str) -> ModuleType:
    path = Path(module_part)
    try:
        if module_part.endswith(".py") or path.is_file():
            return _import_file(require_file(path, "module file", "a .py file"))
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(module_part)
    except ExportError:
        raise
    except BaseException as exc:  # the user's module may raise anything, SystemExit included
        raise ExportError(f"importing {module_part!r} failed: {_one_line(exc)}") from None


def _import_file(path: Path) -> ModuleType:
    name = f"rlserve_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ExportError(f"module file {path}: cannot be imported; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    sys.path.insert(0, str(path.resolve().parent))
    spec.loader.exec_module(module)
    return module


def _attribute(module: ModuleType, attribute: str, target: str) -> Any:
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ExportError(
                f"target {target!r}: {module.__name__} has no attribute {attribute!r}"
            )
        found = getattr(found, part)
    return found


def _call_factory(factory: Any, target: str) -> Any:
    if not callable(factory):
        raise ExportError(
            f"target {target!r}: is a {type(factory).__name__}; name an nn.Module instance or "
            "a zero-argument factory returning one"
        )
    try:
        return factory()
    except Exception as exc:
        raise ExportError(
            f"target {target!r}: calling it with no arguments failed ({_one_line(exc)}); "
            "name a zero-argument factory, e.g. def make_agent(): return Agent(...)"
        ) from None


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
