"""The YAML file of ``--config`` / ``RLSERVE_CONFIG_FILE``: server settings by their names,
and the sections of the PPO/DPO/GRPO service guide's ``service_config.yaml``, so that a file
written from the guide is served as it is:

============================  ==========================
the guide's key               rlserve's setting
============================  ==========================
``service.host``              ``host``
``service.port``              ``port``
``service.workers``           ``workers``
``model.path``                ``model_file``
``model.batch_size``          ``max_batch_size``
============================  ==========================

A file may mix both forms, but may not set one setting twice. Relative paths are taken
from the working directory, as every path setting is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from kernel.errors import ConfigError

SECTIONS: dict[str, dict[str, str]] = {
    "service": {"host": "host", "port": "port", "workers": "workers"},
    "model": {"path": "model_file", "batch_size": "max_batch_size"},
}


def read(path: Path) -> dict[str, Any]:
    """The file's settings by rlserve's names."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config_file: {path} is not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config_file: {path} must hold a mapping of settings, not {type(raw).__name__}"
        )
    return flatten(raw, path)


def flatten(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """``raw`` with the guide's sections replaced by the settings they stand for."""
    settings = {k: v for k, v in raw.items() if k not in SECTIONS}
    for section, keys in SECTIONS.items():
        given = raw.get(section)
        if given is None:
            continue
        if not isinstance(given, dict):
            raise ConfigError(
                f"{path}: {section} must be a mapping with any of {sorted(keys)}, not {given!r}"
            )
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise ConfigError(
                f"{path}: {section}.{unknown[0]} is not a setting; {section} may hold "
                f"{sorted(keys)} (any other setting goes at the top level by its own name)"
            )
        for key, value in given.items():
            name = keys[key]
            if name in settings:
                raise ConfigError(
                    f"{path}: {name} is set twice, as {section}.{key} and as {name}; keep one"
                )
            settings[name] = value
    return settings


class ConfigFileSource(PydanticBaseSettingsSource):
    """The config file as a pydantic-settings source (below flags and env)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        super().__init__(settings_cls)
        self._values = read(path)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)
