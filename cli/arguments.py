"""Command-line arguments declared once, as a dataclass: its fields are the flags and their help.

A field's metadata holds its ``help``; ``positional=True`` makes it a positional argument;
``flag="--name"`` overrides the flag's name.
Field names become ``--kebab-case`` flags; ``bool`` fields are switches; ``list[...]`` fields
may repeat; ``Enum`` fields offer their values as choices.

Settings declared as pydantic fields (``rlserve serve``'s) get their flags from
:mod:`cli.settings_arguments` instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def arg(help: str, *, positional: bool = False, **kwargs: Any) -> Any:
    """Field metadata for an argument (use as ``dataclasses.field(metadata=arg(...))``)."""
    return {"help": help, "positional": positional, **kwargs}


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        _add_one(parser, f, hints[f.name])


def from_namespace(cls: type[T], namespace: argparse.Namespace) -> T:
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    return cls(**{n: getattr(namespace, n) for n in names})


def _add_one(parser: argparse.ArgumentParser, f: dataclasses.Field[Any], hint: Any) -> None:
    meta = dict(f.metadata)
    help_text: str = meta.pop("help", "")
    positional = meta.pop("positional", False)
    flag = meta.pop("flag", "--" + f.name.replace("_", "-"))
    base, optional = _unwrap_optional(hint)
    kwargs: dict[str, Any] = {"help": help_text, **meta}
    has_default = (
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    )
    default = f.default if f.default is not dataclasses.MISSING else None
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    if base is bool:
        parser.add_argument(flag, dest=f.name, action="store_true", default=bool(default), **kwargs)
        return
    if typing.get_origin(base) is list:
        (item,) = typing.get_args(base)
        kwargs.update(type=item, action="append")
    else:
        kwargs["type"] = base
    if isinstance(base, type) and issubclass(base, enum.Enum):
        kwargs["choices"] = list(base)
        kwargs["metavar"] = "{" + ",".join(str(m.value) for m in base) + "}"
    if positional:
        parser.add_argument(f.name, **kwargs)
        return
    if has_default and default is not None and "default: " not in help_text:
        kwargs["help"] = f"{help_text} (default: {_show(default)})"
    required = not has_default and not optional
    parser.add_argument(flag, dest=f.name, default=default, required=required, **kwargs)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)
