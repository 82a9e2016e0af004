"""docs/architecture.md keeps up with the code: every package of ours has a row in its layout
table, every module a row names exists in that package, and every import contract of
pyproject.toml is in its rules table. A package added, moved or removed fails here until
the page says so."""

from __future__ import annotations

import re
import tomllib

from tests.docs.markdown_blocks import REPO

PAGE = REPO / "docs" / "architecture.md"
ROOTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
    "root_packages"
]
_ROW = re.compile(r"^\| `(?P<package>[\w/]+)/`(?: \(top level\))? \| (?P<what>.*) \|$", re.M)
_MODULE = re.compile(r"`(\w+\.py)`")


def packages() -> set[str]:
    """Every folder with an ``__init__.py`` under our root packages, as ``serve/batching``."""
    found = set()
    for root in ROOTS:
        for init in (REPO / root).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(init.parent.relative_to(REPO).as_posix())
    return found


def rows() -> dict[str, str]:
    section = PAGE.read_text().split("## The layout", 1)[1].split("\n## ", 1)[0]
    return {m["package"]: m["what"] for m in _ROW.finditer(section)}


def test_every_package_has_a_row_and_every_row_a_package() -> None:
    table = set(rows())
    assert packages() - table == set(), "packages missing from docs/architecture.md's layout"
    assert table - packages() == set(), "rows of docs/architecture.md for no package"


def test_the_modules_a_row_names_exist_in_its_package() -> None:
    missing = [
        f"{package}/{module}"
        for package, what in rows().items()
        for module in _MODULE.findall(what.split(" still import", 1)[0])
        if "/" not in module and not (REPO / package / module).exists()
    ]
    assert missing == [], "modules docs/architecture.md names that do not exist"


def test_every_import_contract_is_in_the_rules() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    page = PAGE.read_text().split("## Rules", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w-]+)` \|", page, re.M))
    assert {c["id"] for c in contracts["contracts"]} == listed
