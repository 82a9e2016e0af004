"""Version numbers have one spelling, wherever they appear."""

from __future__ import annotations

import pytest

from kernel.versions import MAX_VERSION, parse_version


@pytest.mark.parametrize(
    ("text", "version"), [("1", 1), ("42", 42), (str(MAX_VERSION), MAX_VERSION)]
)
def test_plain_ascii_integers_are_versions(text: str, version: int) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize(
    "text",
    ["", "0", "01", "-5", "+3", " 3", "3 ", "3.0", "1e3", "\u00b2", "\u0661", "\uff13",
     str(MAX_VERSION + 1), "1" * 40, "latest", "0x10"],
)  # fmt: skip
def test_anything_else_is_not_a_version(text: str) -> None:
    assert parse_version(text) is None
