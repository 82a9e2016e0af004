"""The docs run: every sh and python block of README.md and docs/*.md marked runnable is run
as written (docs/contributing.md); every other one says why it is not.

A block runs with the project root's files (a scratch directory of links to them, so what
it writes stays out of the checkout, except through a linked folder), without the virtual
environment on PATH (the docs say ``.venv/bin/...``), and with ``curl`` failing on HTTP
errors (``--fail-with-body``), so a documented request that gets a 4xx or 5xx fails here.
Ports 8000 and 8001 in a block become free ports; ``demo-server`` blocks run while
``make serve`` serves examples/model_repository on them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.docs.markdown_blocks import (
    REPO,
    Block,
    Marker,
    MarkerError,
    Option,
    blocks,
    parse_marker,
    run_blocks,
)
from tests.e2e.server import free_port

FAST_TIMEOUT_S = 60
SLOW_TIMEOUT_S = 600
VENV_BIN = REPO / ".venv" / "bin"


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int


def _runnable() -> list[object]:
    params: list[object] = []
    for block in run_blocks():
        if block.marker is None or not block.marker.runnable:
            continue
        marks = [pytest.mark.slow] if Option.SLOW in block.marker.options else []
        params.append(pytest.param(block, id=block.where, marks=marks))
    return params


def test_every_shell_and_python_block_says_whether_it_runs() -> None:
    unmarked = [b.where for b in run_blocks() if b.marker is None]
    assert not unmarked, (
        "mark these blocks <!-- runnable --> or <!-- not-runnable: why --> on the line "
        f"before the fence (docs/contributing.md): {unmarked}"
    )


def test_a_marker_needs_a_reason_or_known_options(tmp_path: Path) -> None:
    assert parse_marker("<!-- not-runnable: needs a GPU -->") == Marker(False, reason="needs a GPU")
    both = parse_marker("<!-- runnable: demo-server, slow -->")
    assert both is not None
    assert both.options == {Option.DEMO_SERVER, Option.SLOW}
    with pytest.raises(MarkerError, match="say why"):
        parse_marker("<!-- not-runnable -->")
    with pytest.raises(MarkerError, match="valid: \\['demo-server', 'slow'\\]"):
        parse_marker("<!-- runnable: gpu -->")
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- runnable -->\n```sh\necho hi\n```\n\n```python\nx = 1\n```\n")
    first, second = blocks(doc)
    assert (first.language, first.code, first.line) == ("sh", "echo hi\n", 2)
    assert first.marker is not None
    assert first.marker.runnable
    assert second.marker is None


def free_ports() -> Ports:
    return Ports(http=free_port(), grpc=free_port())


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ports]:
    """`make serve` as the README says, on free ports (the serving install taken as made)."""
    ports = free_ports()
    log = tmp_path_factory.mktemp("demo-server") / "make-serve.log"
    command = [
        "make",
        "--no-print-directory",
        "-o",
        ".venv/.serve-installed",
        "serve",
        f"PORT={ports.http}",
        f"GRPC_PORT={ports.grpc}",
    ]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_ready(process, f"http://127.0.0.1:{ports.http}", log)
        yield ports
    finally:
        _stop_group(process)


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"make serve exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"make serve not ready after 60 s:\n{log.read_text()}")


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """make and the server it started: SIGINT to the group, as Ctrl-C would."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def with_ports(code: str, ports: Ports) -> str:
    code = re.sub(r"(?<![\w.])8000(?!\d|\.\d)", str(ports.http), code)
    return re.sub(r"(?<![\w.])8001(?!\d|\.\d)", str(ports.grpc), code)


def test_ports_are_replaced_only_where_they_are_ports() -> None:
    code = "curl localhost:8000/x --port 8000 -u 127.0.0.1:8001 18000 8000.5 80001\n"
    replaced = "curl localhost:1/x --port 1 -u 127.0.0.1:2 18000 8000.5 80001\n"
    assert with_ports(code, Ports(1, 2)) == replaced


def scratch_root(tmp_path: Path) -> Path:
    """A directory that looks like the project root: a link to each of its entries. The
    environment must be installed already: a block's ``make`` that installed it from there
    would write the scratch directory's path into the real environment's scripts."""
    stale = [
        marker.name
        for marker in (REPO / ".venv" / ".serve-installed", REPO / ".venv" / ".test-installed")
        if not marker.exists() or marker.stat().st_mtime < (REPO / "pyproject.toml").stat().st_mtime
    ]
    if stale:
        pytest.fail(
            f"the environment is older than pyproject.toml ({stale}): run `make test` first"
        )
    root = tmp_path / "root"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in {".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"}:
            (root / entry.name).symlink_to(entry)
    return root


def block_env(tmp_path: Path) -> dict[str, str]:
    """The user's shell: no virtual environment on PATH, and curl that fails on HTTP errors."""
    shims = tmp_path / "shims"
    shims.mkdir()
    curl = shutil.which("curl")
    if curl is not None:
        shim = shims / "curl"
        shim.write_text(f'#!/bin/sh\nexec {curl} --fail-with-body "$@"\n')
        shim.chmod(0o755)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != VENV_BIN]
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONHOME"}}
    env["PATH"] = os.pathsep.join([str(shims), *path])
    return env


def command(block: Block, script: Path) -> list[str]:
    if block.language == "python":
        return [str(VENV_BIN / "python"), str(script)]
    return ["bash", "-e", "-o", "pipefail", str(script)]


@pytest.mark.parametrize("block", _runnable())
def test_a_runnable_block_runs_as_written(
    block: Block, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A block that starts a server of its own gets ports of its own, not the demo's."""
    assert block.marker is not None
    if Option.DEMO_SERVER in block.marker.options:
        ports: Ports = request.getfixturevalue("demo_server")
    else:
        ports = free_ports()
    root = scratch_root(tmp_path)
    script = tmp_path / ("block.py" if block.language == "python" else "block.sh")
    script.write_text(with_ports(block.code, ports))
    timeout = SLOW_TIMEOUT_S if Option.SLOW in block.marker.options else FAST_TIMEOUT_S
    done = subprocess.run(
        command(block, script),
        cwd=root,
        env=block_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block.where} ({block.language}) exited with {done.returncode}\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
