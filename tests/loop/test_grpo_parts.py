"""The prompt worker's parts without a server: the prompt dataset and the rewards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernel.errors import ConfigError
from loop.grpo import prompts, rewards


def test_exact_match_compares_normalised_text() -> None:
    assert rewards.exact_match("  The Cat.", {"answer": "the cat"}) == 1.0
    assert rewards.exact_match("the  cat sleeps", {"answer": "the cat"}) == 0.0
    with pytest.raises(ValueError, match="needs each prompt's answer"):
        rewards.exact_match("x", {})


def test_format_check_takes_the_rows_pattern_or_one_sentence() -> None:
    assert rewards.format_check("The cat sleeps.", {}) == 1.0
    assert rewards.format_check("the cat sleeps", {}) == 0.0
    assert rewards.format_check("42", {"format": r"\d+"}) == 1.0


def test_rewards_load_by_name_or_import_path() -> None:
    assert rewards.load("exact_match") is rewards.exact_match
    assert rewards.load("loop.grpo.rewards:format_check") is rewards.format_check
    for bad, message in [
        ("nothing", "give .* or an import path"),
        ("no.such.module:f", "cannot import no.such.module"),
        ("loop.grpo.rewards:missing", "has no function 'missing'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            rewards.load(bad)


def test_prompts_are_read_in_order_and_taken_round_and_round(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    chat = [{"role": "user", "content": "b"}]
    rows: list[dict[str, Any]] = [{"prompt": "a", "answer": "1"}, {"messages": chat}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    taken = prompts.Prompts(prompts.read(path))
    first, second, third = taken.next(), taken.next(), taken.next()
    assert first.request() == {"prompt": "a"}
    assert second.request() == {"messages": chat}
    assert (third.line, third.row) == (1, rows[0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no prompts"),
        ("{not json\n", r"p.jsonl:1: not JSON"),
        ('{"answer": "x"}\n', r"p.jsonl:1: expected an object with 'prompt'"),
    ],
)
def test_a_bad_prompt_file_is_refused_naming_the_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        prompts.read(path)
