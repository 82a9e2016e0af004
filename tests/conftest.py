"""Fixtures shared by test folders. Nothing here imports torch when the module is imported."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from examples.lm.tiny_policy import TinyPolicies

FIXTURES_ENV = "RLSERVE_LM_FIXTURES"


@pytest.fixture(scope="session")
def tiny_policies(tmp_path_factory: pytest.TempPathFactory) -> TinyPolicies:
    """Tiny Llama and Qwen2 policies from genuine TRL runs (examples/lm/tiny_policy.py).

    Built once per test session, in about half a minute, under the session's temporary
    directory. To reuse them between local runs, set ``RLSERVE_LM_FIXTURES=DIR``: they are
    built in DIR only if DIR holds no complete build of the current recipe and library
    versions (its tiny_policies.json says which), and reused otherwise. Tests must not write
    into these directories.
    """
    from examples.lm.tiny_policy import existing_policies, make_policies

    shared = os.environ.get(FIXTURES_ENV)
    root = Path(shared) if shared else tmp_path_factory.mktemp("tiny_policies")
    return existing_policies(root) or make_policies(root)


# ---------------------------------------------------------------------- /dev/shm

_SHM = Path("/dev/shm")
_SHM_BEFORE = pytest.StashKey[frozenset[str]]()


def _shm_names() -> frozenset[str]:
    try:
        return frozenset(entry.name for entry in _SHM.iterdir())
    except OSError:  # no /dev/shm here: nothing to check
        return frozenset()


def _xdist_worker(session: pytest.Session) -> bool:
    """A pytest-xdist worker: the controller checks, before and after every worker."""
    return hasattr(session.config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _xdist_worker(session):
        session.config.stash[_SHM_BEFORE] = _shm_names()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves nothing in /dev/shm (issue 25), its SIGKILL tests included: a file
    there that was not before the session fails the run, named."""
    if _xdist_worker(session):
        return
    before = session.config.stash.get(_SHM_BEFORE, frozenset())
    left = _shm_names() - before
    if left:  # a process stopping at the very end may still be removing its own
        time.sleep(0.5)
        left = _shm_names() - before
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"left in /dev/shm by this session: {', '.join(sorted(left))}"
    if reporter is not None:
        reporter.write_line(message, red=True)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
