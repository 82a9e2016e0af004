"""What the docs' shell blocks name exists, in every block, run or not: each path into the
project's folders (``configs/rl_config.yaml``, ``examples/ppo_trainer.py``) is a file or
folder of the checkout, and each flag given to ``rlserve`` or to one of the project's
scripts is in that command's ``--help``. So a moved file or a renamed flag fails here, also
in the blocks that cannot run on this machine (a cluster, a GPU, minutes of training)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from itertools import pairwise

import pytest

from tests.docs.markdown_blocks import REPO, run_blocks

# The project's own folders: a path a block names inside one of them must exist.
FOLDERS = ("examples", "configs", "kernel", "cli", "client", "serve", "loop", "export", "ops",
           "k8s", "docker", "loadtests",
           "bench", "docs")  # fmt: skip
_PATH = re.compile(rf"^(?:\./)?(?:{'|'.join(FOLDERS)})/[\w./-]*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SUBCOMMAND = re.compile(r"^[a-z][a-z0-9-]*$")


@dataclass(frozen=True)
class Call:
    """One command a block runs: the program (and subcommands) and the flags given."""

    where: str
    program: tuple[str, ...]  # ("rlserve", "export", "sb3"), ("examples/ppo_trainer.py",)
    flags: tuple[str, ...]


def commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block, as words: continuation lines joined, comments
    dropped, split at ``&&``, ``||``, ``;`` and pipes; a command shlex cannot split (a
    here-document, a quote across lines) is left out."""
    found = []
    for line in re.sub(r"\\\n\s*", " ", code).splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            while words and _ASSIGNMENT.match(words[0]):  # VAR=value command ...
                words.pop(0)
            if words:
                found.append(words)
    return found


def calls(where: str, code: str) -> list[Call]:
    """The block's calls of rlserve and of the project's Python scripts."""
    found = []
    for words in commands(code):
        head, rest = words[0], words[1:]
        if head == "rlserve" or head.endswith("/rlserve"):
            program = ["rlserve"]
            while rest and _SUBCOMMAND.match(rest[0]):
                program.append(rest.pop(0))
        elif head.endswith("python") and rest and rest[0].startswith("examples/"):
            program = [rest.pop(0)]
        else:
            continue
        flags = tuple(word.split("=", 1)[0] for word in rest if word.startswith("--"))
        found.append(Call(where, tuple(program), flags))
    return found


@cache
def help_text(program: tuple[str, ...]) -> str:
    """The ``--help`` of ``program``, or of its longest prefix that has one (a word after
    the subcommands may be an argument: ``rlserve serve models``)."""
    for end in range(len(program), 0, -1):
        head = program[:end]
        command = (
            [sys.executable, "-m", "cli", *head[1:]]
            if head[0] == "rlserve"
            else [sys.executable, head[0]]
        )
        done = subprocess.run(
            [*command, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        if done.returncode == 0:
            return done.stdout
    raise AssertionError(f"{' '.join(program)} --help fails: {done.stderr[-500:]}")


def sh_blocks() -> list[tuple[str, str]]:
    return [(b.where, b.code) for b in run_blocks() if b.language == "sh"]


def test_every_project_path_a_block_names_exists() -> None:
    """Paths into the project's folders, and every --config file the block does not write
    itself (an input: the command fails as written without it, as `--config
    rl_config.yaml` did at the root)."""
    missing = []
    for where, code in sh_blocks():
        written = {b for words in commands(code) for a, b in pairwise(words) if a in (">", ">>")}
        for words in commands(code):
            for word in words:
                value = word.split("=", 1)[-1].rstrip(",:")
                if _PATH.match(value) and not (REPO / value).exists():
                    missing.append(f"{where}: {value}")
            configs = [b for a, b in pairwise(words) if a == "--config"]
            configs += [w.split("=", 1)[1] for w in words if w.startswith("--config=")]
            missing += [
                f"{where}: --config {c}"
                for c in configs
                if c not in written and not (REPO / c).is_file()  # written by the block: made
            ]
    assert missing == [], "paths the docs name that are not in the checkout"


def test_every_flag_a_block_gives_is_in_its_commands_help() -> None:
    by_program: dict[tuple[str, ...], list[Call]] = defaultdict(list)
    for where, code in sh_blocks():
        for call in calls(where, code):
            by_program[call.program].append(call)
    assert by_program, "no rlserve or script call found: is the parser broken?"
    unknown = [
        f"{call.where}: {' '.join(program)} {flag}"
        for program, found in sorted(by_program.items())
        for call in found
        for flag in call.flags
        if not re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", help_text(program), re.MULTILINE)
    ]
    assert unknown == [], "flags the docs give that the command's --help does not list"


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("RLSERVE_X=1 .venv/bin/rlserve serve --model-repository m --port 8000 &",
         [("rlserve", "serve"), ("--model-repository", "--port")]),
        ("python examples/ppo_trainer.py --config configs/rl_config.yaml \\\n    --seed 1  # x",
         [("examples/ppo_trainer.py",), ("--config", "--seed")]),
        ("kubectl describe hpa rlserve", None),
        ("rlserve rollout status --namespace x && curl -s localhost",
         [("rlserve", "rollout", "status"), ("--namespace",)]),
    ],
)  # fmt: skip
def test_calls_are_read_as_a_shell_reads_them(
    code: str, expected: list[tuple[str, ...]] | None
) -> None:
    found = calls("here", code)
    if expected is None:
        assert found == []
    else:
        assert [(found[0].program, found[0].flags)] == [tuple(expected)]
