"""The fenced shell and Python blocks of README.md and docs/*.md, with their run markers.

The convention (docs/contributing.md): the line right before a block's
opening fence is an HTML comment, which GitHub does not render:

    <!-- runnable -->                    run it as written, from a copy of the project root
    <!-- runnable: demo-server -->       run it while `make serve` serves the demo repository
    <!-- runnable: slow -->              run it only under `pytest -m slow`
    <!-- runnable: demo-server, slow --> options combine
    <!-- not-runnable: REASON -->        left out, and why (a GPU, a cluster, long training...)

Every ``sh`` and ``python`` block carries one of the two; other blocks (output, YAML, JSON)
are not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_LANGUAGES = ("sh", "python")

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>[^`\s]*)\s*$")
_MARKER = re.compile(
    r"^\s*<!--\s*(?P<kind>runnable|not-runnable)\s*(?::\s*(?P<rest>.*?))?\s*-->\s*$"
)


class Option(Enum):
    DEMO_SERVER = "demo-server"
    SLOW = "slow"


class MarkerError(ValueError):
    """A run marker that does not follow the convention."""


@dataclass(frozen=True)
class Marker:
    runnable: bool
    options: frozenset[Option] = frozenset()
    reason: str = ""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: Marker | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def parse_marker(line: str) -> Marker | None:
    """The marker on ``line``, or None where the line is no run marker."""
    found = _MARKER.match(line)
    if found is None:
        return None
    rest = found["rest"] or ""
    if found["kind"] == "not-runnable":
        if not rest:
            raise MarkerError(f"{line.strip()!r}: say why the block is not run")
        return Marker(runnable=False, reason=rest)
    names = [name.strip() for name in rest.split(",") if name.strip()]
    valid = [option.value for option in Option]
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise MarkerError(f"{line.strip()!r}: unknown option {unknown}; valid: {valid}")
    return Marker(runnable=True, options=frozenset(Option(name) for name in names))


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one markdown file, each with the marker on the line before it."""
    lines = path.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None or not opening["info"]:
            i += 1
            continue
        indent = opening["indent"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
        marker = parse_marker(lines[i - 1]) if i > 0 else None
        found.append(Block(path, i + 1, opening["info"], code, marker))
        i = end + 1
    return found


def user_docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def run_blocks() -> list[Block]:
    """Every sh and python block of the user docs, marked or not."""
    return [b for path in user_docs() for b in blocks(path) if b.language in RUN_LANGUAGES]
