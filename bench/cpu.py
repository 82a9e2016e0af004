"""CPU cores and CPU time: servers on one core, load on another, cost read from the kernel.

Every pinned server runs on ``SERVER_CORE`` and every load generator (wrk, the actor) on
``LOAD_CORE``, through ``taskset``, so neither steals the other's core. A server's cost is
the CPU time its own process tree spent (utime + stime of the process and all descendants,
as /proc/<pid>/stat reports them), whatever the number of cores it used.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
from collections.abc import Iterator

import psutil

SERVER_CORE = 0
LOAD_CORE = 1


def require_cores() -> None:
    """Exit with a message unless taskset exists and both cores are available to us."""
    if shutil.which("taskset") is None:
        raise SystemExit("bench needs taskset on PATH (util-linux) to pin servers and load")
    allowed = os.sched_getaffinity(0)
    if not {SERVER_CORE, LOAD_CORE} <= allowed:
        raise SystemExit(
            f"bench pins servers to core {SERVER_CORE} and load to core {LOAD_CORE}; "
            f"this process may only use cores {sorted(allowed)}"
        )


def pinned(command: list[str], core: int | None) -> list[str]:
    """``command`` run on ``core`` alone (taskset), or unchanged when ``core`` is None."""
    return command if core is None else ["taskset", "-c", str(core), *command]


def tree_seconds(pid: int) -> float:
    """User + system CPU seconds of the process ``pid`` and every descendant alive now."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


@contextlib.contextmanager
def on_core(core: int) -> Iterator[None]:
    """Run the calling thread on ``core`` alone for the block (in-process measurements)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def machine() -> str:
    """This machine, as every section of the benchmark document names it."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"
