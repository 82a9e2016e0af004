"""Command-line flags generated from pydantic settings: a field's name is its flag
(``--kebab-case``), its type the flag's type and choices, its description the flag's help,
followed by the environment variable and the default the field declares.

Every flag defaults to ``None``, meaning 'not given', so that a value comes from the
environment, a file or the field's default unless the command line gives one (the caller's
precedence, e.g. ``serve.config``). ``bool`` fields are ``--name`` / ``--no-name`` pairs;
a field that may be a list repeats its flag; ``Literal`` and ``Enum`` fields offer their
values as choices. A field of another type (an object, a secret) has no command-line form:
the caller leaves it out, or adding it raises ``TypeError``.
"""

from __future__ import annotations

import argparse
import enum
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

_PLAIN = (str, int, float, Path)


def add_settings(
    container: argparse._ActionsContainer,
    fields: Mapping[str, FieldInfo],
    *,
    env_prefix: str,
    flags: Mapping[str, str] | None = None,
) -> None:
    """A flag for each of ``fields`` (``flags`` names those not called ``--kebab-case``)."""
    for name, field in fields.items():
        flag = (flags or {}).get(name, "--" + name.replace("_", "-"))
        container.add_argument(flag, dest=name, default=None, **_shape(name, field, env_prefix))


def add_positional(
    container: argparse._ActionsContainer, name: str, field: FieldInfo, *, env_prefix: str
) -> None:
    """``field`` as an optional positional argument (``NAME``), None when not given."""
    container.add_argument(
        name, nargs="?", default=None, metavar=name.upper(), **_shape(name, field, env_prefix)
    )


def given(namespace: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The values of ``names`` on the command line; ``None``: not given."""
    return {name: getattr(namespace, name) for name in names}


def help_text(name: str, field: FieldInfo, env_prefix: str, *, repeats: bool = False) -> str:
    """The field's description, then where else it comes from and its default."""
    description = field.description
    if not description:
        raise TypeError(f"{name}: a setting offered as a flag needs a description (its help)")
    sources = ("repeat the flag for each, in order; " if repeats else "") + (
        f"env {env_prefix}{name.upper()}"
    )
    default = field.get_default(call_default_factory=True)
    if default is not None and "default:" not in description:
        sources += f"; default: {shown(default)}"
    return f"{description} ({sources})".replace("%", "%%")  # argparse %-formats help


def shown(value: Any) -> str:
    """A default as one would type it (``false``, ``allow``, ``1000``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return format(value, "g")
    return str(value)


def _shape(name: str, field: FieldInfo, env_prefix: str) -> dict[str, Any]:
    shape = _type_shape(name, field.annotation)
    repeats = shape.get("action") == "append"
    return {**shape, "help": help_text(name, field, env_prefix, repeats=repeats)}


def _type_shape(name: str, annotation: Any) -> dict[str, Any]:
    members = _members(annotation)
    lists = [m for m in members if typing.get_origin(m) is list]
    if lists:
        (item,) = typing.get_args(lists[0])
        return {"action": "append", "type": _plain(_strip(item))}
    if len(members) != 1:
        raise TypeError(f"{name}: no command-line form for {annotation!r}")
    (base,) = members
    if base is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(base) is typing.Literal:
        return {"type": str, "choices": [str(v) for v in typing.get_args(base)]}
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return {"type": str, "choices": [str(m.value) for m in base]}
    if base in _PLAIN:
        return {"type": base}
    raise TypeError(f"{name}: no command-line form for {annotation!r}; leave it out")


def _members(annotation: Any) -> list[Any]:
    """The types a value may have, None and ``Annotated`` constraints left out."""
    annotation = _strip(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [_strip(a) for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _plain(item: Any) -> Any:
    if item not in _PLAIN:
        raise TypeError(f"no command-line form for a list of {item!r}")
    return item
