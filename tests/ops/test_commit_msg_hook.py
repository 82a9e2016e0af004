"""The commit-msg hook (`make hooks`): a subject of at most 72 characters, then a blank
line before any body; anything else is refused with a message that says why."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.ops.conftest import REPO

HOOK = REPO / ".githooks" / "commit-msg"


def hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True, timeout=10)


@pytest.mark.parametrize(
    "message",
    [
        "lane: seal the slot memfd\n",
        "x" * 72 + "\n\nThe body may be as long as it needs to be " + "y" * 200 + "\n",
        "# a comment git adds\nsubject after a comment\n",
    ],
)
def test_a_well_formed_message_passes(tmp_path: Path, message: str) -> None:
    done = hook(tmp_path, message)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("message", "why"),
    [
        ("x" * 73 + "\n", "the subject has 73 characters, 72 at most"),
        ("subject\nbody right after it\n", "leave the second line blank"),
        ("\n", "the message is empty"),
    ],
)
def test_a_malformed_message_is_refused_saying_why(tmp_path: Path, message: str, why: str) -> None:
    done = hook(tmp_path, message)
    assert done.returncode == 1
    assert why in done.stderr
