"""Reward functions: how a prompt worker scores a completion.

A reward function takes the completion's text and the prompt's row (its ``answer`` and
whatever else the dataset's line holds) and returns a float. Two ship here; any other is
named by import path, ``package.module:function`` (``--reward``), and loaded with
:func:`load`:

- :func:`exact_match`: 1.0 when the completion, normalised (case, surrounding whitespace
  and punctuation, runs of spaces), equals the row's ``answer`` normalised alike; else 0.0.
- :func:`format_check`: 1.0 when the whole completion (stripped) matches the row's
  ``format`` regular expression (default: one sentence: a capital letter, no line break,
  a closing full stop); else 0.0.
"""

from __future__ import annotations

import importlib
import re
import string
from collections.abc import Mapping
from typing import Any, Protocol

from kernel.errors import ConfigError

SENTENCE = r"[A-Z][^\n]*[.!?]"  # format_check's default: one sentence on one line


class Reward(Protocol):
    def __call__(self, completion: str, row: Mapping[str, Any]) -> float:
        """The completion's reward; ``row`` is its prompt's line of the dataset."""
        ...


def normalised(text: str) -> str:
    """Lower case, punctuation and surrounding whitespace stripped, single spaces."""
    stripped = text.strip().strip(string.punctuation + string.whitespace)
    return " ".join(stripped.lower().split())


def exact_match(completion: str, row: Mapping[str, Any]) -> float:
    answer = row.get("answer")
    if not isinstance(answer, str):
        raise ValueError("exact_match needs each prompt's answer: a string field 'answer'")
    return float(normalised(completion) == normalised(answer))


def format_check(completion: str, row: Mapping[str, Any]) -> float:
    pattern = row.get("format", SENTENCE)
    return float(re.fullmatch(pattern, completion.strip()) is not None)


SHIPPED: dict[str, Reward] = {"exact_match": exact_match, "format_check": format_check}


def load(name: str) -> Reward:
    """A shipped reward by name, or any function by import path ``module:function``."""
    if name in SHIPPED:
        return SHIPPED[name]
    module_name, colon, attribute = name.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(
            f"reward {name!r}: give {sorted(SHIPPED)} or an import path, package.module:function"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"reward {name!r}: cannot import {module_name}: {error}") from None
    found = getattr(module, attribute, None)
    if not callable(found):
        raise ConfigError(f"reward {name!r}: {module_name} has no function {attribute!r}")
    reward: Reward = found
    return reward
