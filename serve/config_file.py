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

Reading the file, and refusing one that is missing, not YAML or not a mapping, is
``cli.config_file``'s, as for the loop's files; what is here is the server's alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from cli import config_file
from kernel.errors import ConfigError

SECTIONS: dict[str, dict[str, str]] = {
    "service": {"host": "host", "port": "port", "workers": "workers"},
    "model": {"path": "model_file", "batch_size": "max_batch_size"},
}


def read(path: Path) -> dict[str, Any]:
    """The file's settings by rlserve's names (reading it is ``cli.config_file``'s)."""
    return flatten(config_file.read(path), path)


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


class ConfigFileSource(config_file.MappingSource):
    """The config file as a pydantic-settings source (below flags and env), its sections
    flattened before pydantic sees them, so that a guide's key is checked as the setting
    it stands for."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        super().__init__(settings_cls, read(path))
