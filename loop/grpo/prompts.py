"""A prompt dataset: a JSONL file, one prompt per line.

Each line is an object with ``prompt`` (text) or ``messages`` (a chat, rendered by the
model's chat template on the server), and whatever the reward function reads (``answer``
for :func:`loop.grpo.rewards.exact_match`, ``format`` for ``format_check``). Lines are
taken in order, round and round (:meth:`Prompts.next`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PromptRow:
    line: int  # 1-based, in the file
    row: dict[str, Any]  # the whole line, as the reward function sees it

    def request(self) -> dict[str, Any]:
        """The generate request's prompt part: ``prompt`` or ``messages``."""
        if "messages" in self.row:
            return {"messages": self.row["messages"]}
        return {"prompt": self.row["prompt"]}


def read(path: Path) -> list[PromptRow]:
    """Every line of the dataset; ConfigError naming the first bad one."""
    rows = []
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"prompts {path}: {error.strerror}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"prompts {path}:{number}: not JSON ({error.msg})") from None
        given = isinstance(row, dict) and (
            isinstance(row.get("prompt"), str) or isinstance(row.get("messages"), list)
        )
        if not given:
            raise ConfigError(
                f"prompts {path}:{number}: expected an object with 'prompt' (text) or "
                "'messages' (a chat)"
            )
        rows.append(PromptRow(number, row))
    if not rows:
        raise ConfigError(f"prompts {path}: no prompts")
    return rows


class Prompts:
    """The dataset's rows, round and round."""

    def __init__(self, rows: list[PromptRow]) -> None:
        self.rows = rows
        self._next = 0

    def next(self) -> PromptRow:
        row = self.rows[self._next % len(self.rows)]
        self._next += 1
        return row
