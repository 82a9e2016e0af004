"""The policy server as a child process (``loop/child_server.py``), and the co-located
runner that starts it (``examples/ppo_colocated.py --serve-repository``).

Real servers throughout: a child that cannot start fails fast with its log's last lines; a
child is stopped (SIGTERM: it drains) however its parent leaves the ``with`` block,
SIGTERM included; a child that dies is noticed at once; and the runner, which fails or
loses its child, stops it or stops itself with a clear error instead of retrying."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from kernel.errors import ConfigError
from loop.child_server import ChildServer, ChildServerFailed, ChildState, free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_REPOSITORY = ROOT / "examples" / "model_repository"
TRAINER = ROOT / "examples" / "ppo_trainer.py"
RUNNER = ROOT / "examples" / "ppo_colocated.py"
REFERENCE = ROOT / "configs" / "rl_config.yaml"
TOKEN = "child-server-test-token"
MODEL = "cartpole"
FAST_S = 15.0  # a failed start is reported within this (the server starts in ~2 s)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def served(tmp: Path) -> Path:
    """A copy of the example repository (a server writes its state into the one it serves)."""
    shutil.copytree(EXAMPLE_REPOSITORY / MODEL, tmp / "repository" / MODEL)
    return tmp / "repository"


def child(repository: Path, tmp: Path, **kwargs: object) -> ChildServer:
    return ChildServer(repository, log=tmp / "server.log", admin_token=TOKEN, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- starting


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("empty", "no models found"),
        ("invalid", "onnxruntime cannot load it"),
        ("missing", "is not a directory"),
    ],
)
def test_a_repository_it_cannot_serve_fails_fast_naming_the_log(
    tmp_path: Path, content: str, expected: str
) -> None:
    repository = tmp_path / "repository"
    if content != "missing":
        repository.mkdir()
    if content == "invalid":
        (repository / MODEL / "1").mkdir(parents=True)
        (repository / MODEL / "1" / "model.onnx").write_bytes(b"not onnx")
    server = child(repository, tmp_path)
    started = time.monotonic()
    with pytest.raises(ChildServerFailed) as failed:
        server.start()
    assert time.monotonic() - started < FAST_S
    message = failed.value.message
    assert expected in message  # the server's own words, from its log
    assert str(tmp_path / "server.log") in message
    assert str(repository) in message
    # a server that runs on, not ready, was stopped; one that exited was reaped
    assert server.state is ChildState.STOPPED
    assert server.pid is not None
    assert gone(server.pid)


def test_a_taken_port_is_refused_before_starting(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = child(served(tmp_path), tmp_path, port=port)
        started = time.monotonic()
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is taken"):
            server.start()
        assert time.monotonic() - started < 1.0
    assert server.state is ChildState.NOT_STARTED  # nothing was started


# ---------------------------------------------------------------------- stopping


def serve_then_fail(server: ChildServer, error: type[BaseException]) -> None:
    with server:
        assert server.state is ChildState.RUNNING
        assert httpx.get(server.url + "/ready").status_code == 200
        raise error("the runner failed")


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_stopped_with_sigterm_however_the_block_ends(
    tmp_path: Path, error: type[BaseException]
) -> None:
    server = child(served(tmp_path), tmp_path)
    with pytest.raises(error):
        serve_then_fail(server, error)
    pid = server.pid
    assert pid is not None
    assert gone(pid)
    assert server.state is ChildState.STOPPED
    assert server.stop() == -signal.SIGTERM  # its exit status, asked again
    log = (tmp_path / "server.log").read_text()
    assert "rlserve.phases: draining" in log  # drained: SIGTERM, not SIGKILL
    assert log.rstrip().endswith(f"Finished server process [{pid}]")
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/ready")


def test_sigterm_to_the_parent_stops_the_child(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from loop.child_server import ChildServer
        with ChildServer(Path({str(served(tmp_path))!r}), log=Path({str(tmp_path)!r}) /
                         "server.log", admin_token={TOKEN!r}) as server:
            print(server.pid, flush=True)
            time.sleep(120)
    """)
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(30) == 128 + signal.SIGTERM
    finally:
        parent.kill()
        parent.communicate()  # reaped, its pipe closed
    assert gone(pid)
    assert "rlserve.phases: draining" in (tmp_path / "server.log").read_text()


# ---------------------------------------------------------------------- while it runs


def test_a_check_after_a_failure_waits_for_a_killed_child_to_be_seen_exiting(
    tmp_path: Path,
) -> None:
    """A killed child's connections close before its exit can be seen: a check asked with
    a wait (after a request failed) names the exit instead of letting the reset through."""
    with child(served(tmp_path), tmp_path) as server:
        server.check(wait_s=0.05)  # alive: it waits that long, then has nothing to say
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(ChildServerFailed, match=r"exited with status -9 \(SIGKILL\)"):
            server.check(wait_s=10)
        assert time.monotonic() - started < 5  # as soon as the exit shows, not the whole wait


def test_a_child_that_dies_is_noticed_at_once(tmp_path: Path) -> None:
    noticed = threading.Event()
    with child(served(tmp_path), tmp_path) as server:
        server.check()  # alive: nothing to say
        server.on_exit(noticed.set)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        assert noticed.wait(5)
        assert server.state is ChildState.EXITED
        with pytest.raises(ChildServerFailed, match=r"exited with status -9 \(SIGKILL\)"):
            server.check()
        late = threading.Event()
        server.on_exit(late.set)  # registered after the exit: called at once
        assert late.is_set()
    assert server.state is ChildState.STOPPED


# ---------------------------------------------------------------------- the runner


class Lines:
    """A process's stderr, line by line, read by a thread: ``until`` waits for a line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            self._queue.put(line)
        process.stderr.close()  # at its end: the process is gone

    def until(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} in {timeout_s:g} s: {''.join(self.seen)}")

    def rest(self) -> str:
        while not self._queue.empty():
            self.seen.append(self._queue.get())
        return "".join(self.seen)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Version 1 of a fresh policy and its checkpoint, as the documented first step makes
    them; each test serves a copy."""
    tmp = tmp_path_factory.mktemp("policy")
    subprocess.run(
        [sys.executable, str(TRAINER), "--init-repository", str(tmp / "repository"),
         "--model", MODEL, "--checkpoint", str(tmp / "agent.pt"), "--seed", "1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
        capture_output=True, timeout=120,
    )  # fmt: skip
    return tmp / "repository", tmp / "agent.pt"


def own_metrics_port() -> list[str]:
    """A free port for the trainer's /metrics: the reference config's default (9400) is one
    port for every trainer, and tests in other files start trainers at the same time."""
    return ["--metrics-port", str(free_port())]


def run_colocated(tmp: Path, policy: tuple[Path, Path], *flags: str) -> subprocess.Popen[str]:
    repository = tmp / "repository"
    shutil.copytree(policy[0], repository)
    return subprocess.Popen(
        [sys.executable, str(TRAINER), "--config", str(REFERENCE), "--model", MODEL,
         "--serve-repository", str(repository), "--serve-log", str(tmp / "server.log"),
         "--max-env-steps", "10000000", "--logdir", "none", *own_metrics_port(), *flags],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "RLSERVE_ADMIN_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def child_pid(line: str) -> int:
    return int(line.split(" as pid ")[1].split()[0])


def test_a_runner_that_fails_stops_its_child(tmp_path: Path, policy: tuple[Path, Path]) -> None:
    saved = torch.load(policy[1], weights_only=True)
    saved["version"] = 7  # not what the server serves: the runner refuses to go on
    torch.save(saved, tmp_path / "agent.pt")
    runner = run_colocated(tmp_path, policy, "--checkpoint", str(tmp_path / "agent.pt"))
    try:
        lines = Lines(runner)
        pid = child_pid(lines.until("started rlserve serve", 120))
        assert runner.wait(60) == 1
    finally:
        runner.kill()
    assert "serves cartpole version 1, " in lines.rest()
    assert gone(pid)
    log = (tmp_path / "server.log").read_text()
    assert "rlserve.phases: draining" in log
    assert log.rstrip().endswith(f"Finished server process [{pid}]")


def test_a_runner_whose_child_dies_stops_with_a_clear_error(
    tmp_path: Path, policy: tuple[Path, Path]
) -> None:
    checkpoint = tmp_path / "agent.pt"
    shutil.copy(policy[1], checkpoint)
    runner = run_colocated(tmp_path, policy, "--checkpoint", str(checkpoint))
    try:
        lines = Lines(runner)
        pid = child_pid(lines.until("started rlserve serve", 120))
        lines.until("version 1 of cartpole", 60)  # the turns have begun
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        status = runner.wait(30)  # not the workers' 60 s of retries
        stopped_s = time.monotonic() - killed
    finally:
        runner.kill()
    output = lines.rest()
    assert status == 1, output
    assert stopped_s < 20, output
    assert "exited with status -9 (SIGKILL) while it was needed" in output
    assert str(tmp_path / "server.log") in output  # where to look
