"""docs/serving.md's settings table against serve.config.Settings: every setting listed once,
with the default its field declares."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from serve import config

SERVING_MD = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
UNSET = ("unset", "the only model")  # how the table says a default is None


def settings_table() -> dict[str, str]:
    """Each setting the Configuration section's table names, with its default as written."""
    section = SERVING_MD.read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| setting | default | meaning |\n|---|---|---|\n", 1)[1]
    rows: dict[str, str] = {}
    for line in table.splitlines():
        if not line.startswith("|"):
            break
        names_cell, defaults_cell = (c.strip() for c in line.strip("|").split("|")[:2])
        names = re.findall(r"`(\w+)`", names_cell)
        defaults = [d.strip() for d in split_defaults(defaults_cell)]
        assert len(names) == len(defaults), f"{line}: a default for each setting"
        for name, default in zip(names, defaults, strict=True):
            assert name not in rows, f"{name} is listed twice"
            rows[name] = default
    return rows


def split_defaults(cell: str) -> list[str]:
    """``unset, 60`` or ``{latest: 1}``: commas inside braces or parentheses do not split."""
    parts, depth, current = [], 0, ""
    for char in cell:
        depth += char in "({"
        depth -= char in ")}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def documented(text: str) -> Any:
    text = text.strip("`")
    if text.startswith(UNSET):
        return None
    if text in ("true", "false"):
        return text == "true"
    if mib := re.fullmatch(r"(\d+) MiB", text):
        return int(mib.group(1)) * 2**20
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    if text.startswith("{"):
        return yaml.safe_load(text)
    return text


def declared(default: Any) -> Any:
    if isinstance(default, bool) or default is None:
        return default
    if isinstance(default, Enum):
        return default.value
    if isinstance(default, BaseModel):
        return default.model_dump(exclude_none=True)
    if isinstance(default, int | float):
        return float(default)
    return str(default)


def test_the_table_lists_every_setting_and_no_other() -> None:
    assert sorted(settings_table()) == sorted(config.Settings.model_fields)


@pytest.mark.parametrize("name", sorted(config.Settings.model_fields))
def test_the_table_gives_the_default_the_field_declares(name: str) -> None:
    field = config.Settings.model_fields[name]
    written = settings_table().get(name)
    assert written is not None, f"{name} is not in docs/serving.md's settings table"
    assert documented(written) == declared(field.get_default(call_default_factory=True)), name
