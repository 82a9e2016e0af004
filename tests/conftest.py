"""Fixtures shared by test folders. Nothing here imports torch when the module is imported."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:
    from examples.lm.tiny_policy import TinyPolicies

FIXTURES_ENV = "RLSERVE_LM_FIXTURES"
T = TypeVar("T")


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]
) -> T:
    """``build(folder)``'s result, made once per test run however many pytest-xdist workers
    ask: the first to take ``name``'s lock builds in a folder every worker of the run sees
    (the workers' temporary directories share a parent), the others wait on the lock and
    then ``build`` in the same folder, which must reuse what is there (each builder below
    finds its finished work by a file written last)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if _xdist_worker_env() else base
    folder = shared / f"built-once-{name}"
    folder.mkdir(exist_ok=True)
    with open(shared / f"built-once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return build(folder)


def _xdist_worker_env() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


@pytest.fixture(scope="session")
def recurrent_ppo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RecurrentPPO on CartPole with its velocities hidden (tests/export/export_policies.py),
    trained once per test run: the zip the export and e2e recurrent tests share."""
    from tests.export.export_policies import train_recurrent_ppo

    def build(folder: Path) -> Path:
        path = folder / "recurrent_ppo.zip"
        if not path.is_file():
            train_recurrent_ppo(folder / "training.zip")
            os.replace(folder / "training.zip", path)  # whole, or not there
        return path

    return built_once(tmp_path_factory, "recurrent-ppo", build)


@pytest.fixture(scope="session")
def tiny_policies(tmp_path_factory: pytest.TempPathFactory) -> TinyPolicies:
    """Tiny Llama and Qwen2 policies from genuine TRL runs (examples/lm/tiny_policy.py).

    Built once per test run (``built_once``: the pytest-xdist workers share them), in about
    half a minute, under the run's temporary directory. To reuse them between local runs,
    set ``RLSERVE_LM_FIXTURES=DIR``: they are built in DIR only if DIR holds no complete
    build of the current recipe and library versions (its tiny_policies.json says which),
    and reused otherwise. Tests must not write
    into these directories.
    """
    from examples.lm.tiny_policy import existing_policies, make_policies

    shared = os.environ.get(FIXTURES_ENV)
    if shared:
        return existing_policies(Path(shared)) or make_policies(Path(shared))

    def build(root: Path) -> TinyPolicies:
        return existing_policies(root) or make_policies(root)

    return built_once(tmp_path_factory, "tiny-policies", build)


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
