"""Messages that quote what a client sent (kernel.errors): names and lists cut with their
counts, every message capped, so no error answer grows with the request (values are
kernel.json_shown's)."""

from __future__ import annotations

import pytest

from kernel.errors import (
    LISTED_ITEMS,
    MESSAGE_CHARACTERS,
    NAME_CHARACTERS,
    InvalidInput,
    NotFound,
    listed,
    quoted,
)


def test_a_short_name_is_quoted_whole() -> None:
    assert quoted("obs") == "'obs'"
    assert quoted("it's") == '"it\'s"'
    assert quoted("a" * NAME_CHARACTERS) == repr("a" * NAME_CHARACTERS)


def test_a_long_name_is_its_start_and_its_length() -> None:
    text = quoted("a" * 20_000)
    assert text == f"'{'a' * NAME_CHARACTERS}…' (20,000 characters)"
    assert quoted("é" * 100).endswith("…' (100 characters)")


def test_a_short_list_is_listed_whole() -> None:
    assert listed(["a", "b"]) == "['a', 'b']"
    assert listed([]) == "[]"


def test_a_long_list_is_its_first_names_and_how_many_more() -> None:
    names = [f"x{i}" for i in range(20_000)]
    assert listed(names) == "['x0', 'x1', 'x2', … and 19,997 more]"
    assert LISTED_ITEMS == 3


def test_long_names_in_a_list_are_cut_too() -> None:
    text = listed(["b" * 20_000] * 5)
    assert text.count("(20,000 characters)") == LISTED_ITEMS
    assert text.endswith("… and 2 more]")
    assert len(text) < 400


@pytest.mark.parametrize("error", [InvalidInput, NotFound])
def test_every_message_is_capped(error: type[InvalidInput] | type[NotFound]) -> None:
    raised = error("x" * 500_000)
    assert len(raised.message) < MESSAGE_CHARACTERS + 80
    assert raised.message.endswith("(the message was cut: 500,000 characters)")
    assert str(raised) == raised.message
    assert raised.to_json()["error"]["message"] == raised.message


def test_a_message_within_the_cap_is_unchanged() -> None:
    assert NotFound("model 'nope': unknown model").message == "model 'nope': unknown model"
