"""The YAML config files every package's commands read: one file into a mapping of settings,
several files merged into one, and that mapping as a pydantic-settings source.

The server (``rlserve serve --config``, ``serve.config_file``) and the RL loop
(``rlserve collect --config``, ``loop.config``) read their files here, so that a file a
person got wrong is refused with the same message whichever command read it: the message
names the file and says what would do. What a file may hold is each caller's: the server
flattens the service guide's sections, the loop refuses secrets and nested file lists.
The kernel's :class:`~kernel.errors.ConfigError` carries every refusal, so the CLI prints
it on one line and exits with status 2.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from kernel.errors import ConfigError, one_line


def read(path: Path) -> dict[str, Any]:
    """The settings in one YAML file; an empty file holds none.

    Checked for existence first, so that a mistyped path is named as such rather than as
    an operating-system error; a parser's complaint is quoted on one line, as it runs over
    several and the CLI prints one."""
    if not path.is_file():
        raise ConfigError(f"config_file: {path} does not exist; give the path of a YAML file")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{path}: not valid YAML ({one_line(exc)}); correct it where the parser points"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: expected a mapping of settings, got {type(raw).__name__}; write one "
            "'name: value' per setting at the top level"
        )
    return raw


def merged(layers: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``layers`` (files' settings, in order) as one mapping, a later layer winning.

    Sections merge key by key rather than as wholes, so that a file that sets one field of
    a section (``sync_policy.yaml``) keeps what an earlier file set of its others. The
    layers are read as they are consumed: a generator of files stops at the first bad one."""
    result: dict[str, Any] = {}
    for layer in layers:
        result = _over(result, layer)
    return result


def _over(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` laid over ``base``: mappings on both sides merge, anything else replaces."""
    result = dict(base)
    for key, value in top.items():
        below = result.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            result[key] = _over(below, value)
        else:
            result[key] = value
    return result


class MappingSource(PydanticBaseSettingsSource):
    """Settings already read (a file's) as a pydantic-settings source; its place among the
    environment and the flags is the caller's ``settings_customise_sources``.

    Names are taken exactly as written: a name the settings do not declare is left for
    their ``extra="forbid"`` to refuse, naming it, instead of being matched loosely."""

    def __init__(self, settings_cls: type[BaseSettings], values: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = dict(values)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)
