"""The policy server as a child process of the program that needs it (co-located layout).

``cluster_mode: co-located`` is one process tree on one node (docs/rl-loop.md, "Co-located
mode"): the runner (``examples/ppo_colocated.py --serve-repository DIR``) starts
``rlserve serve`` as its child with :class:`ChildServer` and stops it when it ends:

    with ChildServer(Path("models"), log=Path("runs/server.log"), admin_token=token) as server:
        client = PolicyClient(server.url, admin_token=token)  # ready: /ready answered 200
        ...
        server.check()  # raises ChildServerFailed if the child exited meanwhile

Starting: ``python -m cli serve --model-repository DIR --host 127.0.0.1 --port P
--drain-delay-s 0`` (nothing load-balances a child: no endpoint has to drop it before it
stops), with the admin token as ``RLSERVE_ADMIN_TOKEN`` and, when the role has GPUs,
``CUDA_VISIBLE_DEVICES``; every other server setting comes from the inherited
``RLSERVE_*`` environment. Its stdout and stderr go to ``log`` (overwritten). A port taken
already is refused before anything starts. :meth:`start` returns once ``GET /ready``
answers 200; it fails (:class:`ChildServerFailed`, naming the log and quoting its last
lines) when the child exits first, when the server has started but a model cannot load
(nothing in the repository, a file onnxruntime refuses: that will not change by waiting),
or after ``ready_timeout_s``.

Stopping (leaving the ``with`` block normally, by an exception, ``KeyboardInterrupt``, or
SIGTERM, which :meth:`__enter__` turns into ``SystemExit(143)`` in the main thread so that
the block unwinds): SIGTERM to the child, which drains (serve/process/phases.py) and exits;
SIGKILL to its process group after ``stop_timeout_s``. The child runs in its own session,
so a Ctrl-C in the terminal reaches only the parent, which then stops the child in that
order. On Linux the child also gets SIGTERM if the thread that started it dies without
stopping it (``PR_SET_PDEATHSIG``: the parent killed with SIGKILL), so no server outlives
its runner.

While the parent runs, a thread waits for the child: if it exits unasked, the callbacks
given to :meth:`on_exit` run (the co-located runner stops its rollout workers, which would
otherwise retry the vanished server for ``retry_for_s``) and :meth:`check` raises.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import IO, Any

import httpx

from kernel.errors import ConfigError, ServiceUnavailable

PR_SET_PDEATHSIG = 1  # linux/prctl.h
TAIL_LINES = 20
POLL_S = 0.05


class ChildServerFailed(ServiceUnavailable):
    """The child server did not become ready, or exited while it was needed."""


class ChildState(Enum):
    NOT_STARTED = "not started"
    STARTING = "starting"  # started, /ready not yet 200
    RUNNING = "running"
    EXITED = "exited"  # ended without being asked to
    STOPPING = "stopping"
    STOPPED = "stopped"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """ConfigError when something listens on ``host:port`` already."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            s.bind((host, port))
        except OSError as error:
            raise ConfigError(
                f"port {port} on {host} is taken ({error.strerror}): another server runs "
                "there; give a free port, or none to have one chosen"
            ) from None


class ChildServer:
    """``rlserve serve`` on ``repository`` as a child process: see the module docstring.

    ``cuda_visible_devices`` (``LoopConfig.cuda_visible_devices("inference")``) is set for
    the child when not empty; ``environ`` is the environment it inherits (default: this
    process's, when started); ``lane``: the child also listens on a local lane at that
    path (``rlserve serve --lane``), for rollout workers in this process."""

    def __init__(
        self,
        repository: Path,
        *,
        log: Path,
        admin_token: str,
        port: int | None = None,
        host: str = "127.0.0.1",
        cuda_visible_devices: str = "",
        environ: Mapping[str, str] | None = None,
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
        lane: Path | None = None,
    ) -> None:
        if ready_timeout_s <= 0 or stop_timeout_s <= 0:
            raise ConfigError(
                f"ready_timeout_s and stop_timeout_s must be > 0, got {ready_timeout_s:g} "
                f"and {stop_timeout_s:g}"
            )
        self.repository, self.log, self.host = repository, log, host
        self.port = port if port is not None else free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self._token, self._gpus, self._environ = admin_token, cuda_visible_devices, environ
        self.lane = lane  # the server's local lane (--lane), for workers in this process
        self._process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None
        self._ready = False
        self._stopping = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._exit_seen = False  # by the watching thread: the callbacks ran, or run at once
        self._lock = threading.Lock()
        self._previous_sigterm: Any = None

    # -- what it is -------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def state(self) -> ChildState:
        if self._process is None:
            return ChildState.NOT_STARTED
        ended = self._process.poll() is not None
        if self._stopping.is_set():
            return ChildState.STOPPED if ended else ChildState.STOPPING
        if ended:
            return ChildState.EXITED
        return ChildState.RUNNING if self._ready else ChildState.STARTING

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "cli", "serve",
            "--model-repository", str(self.repository),
            "--host", self.host, "--port", str(self.port), "--drain-delay-s", "0",
            *(["--lane", str(self.lane)] if self.lane is not None else []),
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = dict(os.environ if self._environ is None else self._environ)
        env["RLSERVE_ADMIN_TOKEN"] = self._token
        if self._gpus:
            env["CUDA_VISIBLE_DEVICES"] = self._gpus
        return env

    # -- starting ---------------------------------------------------------------------

    def start(self) -> ChildServer:
        """Start the child and wait until it is ready; stopped again if that fails."""
        if self._process is not None:
            raise RuntimeError("a ChildServer starts once")
        check_port_free(self.host, self.port)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._output = self.log.open("wb")
        self._process = subprocess.Popen(
            self.command(), env=self.environment(), stdin=subprocess.DEVNULL,
            stdout=self._output, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_parent_death_signal(),
        )  # fmt: skip
        threading.Thread(target=self._watch, name=f"child-server-{self.pid}", daemon=True).start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._ready = True
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        last = "no answer yet"
        with httpx.Client(base_url=self.url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                self._raise_if_exited("while starting")
                try:
                    answer = http.get("/ready")
                except httpx.TransportError as error:
                    last = f"GET /ready: {type(error).__name__}"
                else:
                    if answer.status_code == 200:
                        return
                    last = f"GET /ready: {answer.status_code} {answer.text}"
                    if _started_but_unservable(http, answer):
                        raise self._failure(f"started but cannot serve ({last})")
                time.sleep(POLL_S)
        raise self._failure(f"was not ready after {self.ready_timeout_s:g} s (last: {last})")

    # -- while it runs ----------------------------------------------------------------

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from another thread) if the child exits unasked; at once if it
        already has."""
        with self._lock:
            now = self._exit_seen
            if not now:
                self._callbacks.append(callback)
        if now:
            callback()

    def check(self, *, wait_s: float = 0.0) -> None:
        """ChildServerFailed if the child exited unasked. ``wait_s``: how long to give a
        child that may be exiting to finish first, asked after a request failed: a killed
        child's connections close before its exit can be seen."""
        if wait_s > 0 and self._process is not None and not self._stopping.is_set():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(wait_s)
        self._raise_if_exited("while it was needed")

    def _raise_if_exited(self, when: str) -> None:
        if self._process is None or self._stopping.is_set():
            return
        code = self._process.poll()
        if code is not None:
            raise self._failure(f"exited with status {_status(code)} {when}")

    def _watch(self) -> None:
        assert self._process is not None
        with contextlib.suppress(ChildProcessError):  # reaped already: it has exited
            os.waitid(os.P_PID, self._process.pid, os.WEXITED | os.WNOWAIT)  # leaves it to Popen
        if self._stopping.is_set():
            return
        with self._lock:
            self._exit_seen = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def _failure(self, what: str) -> ChildServerFailed:
        return ChildServerFailed(
            f"the policy server (rlserve serve --model-repository {self.repository} on "
            f"{self.url}, pid {self.pid}) {what}. Its output is in {self.log}; the last "
            f"lines:\n{self.output_tail()}"
        )

    def output_tail(self, lines: int = TAIL_LINES) -> str:
        if self._output is not None and not self._output.closed:
            self._output.flush()
        try:
            with self.log.open(errors="replace") as text:
                return "".join(deque(text, maxlen=lines)).rstrip() or "(nothing)"
        except OSError as error:
            return f"(unreadable: {error})"

    # -- stopping ---------------------------------------------------------------------

    def stop(self) -> int | None:
        """SIGTERM (the server drains), then SIGKILL after ``stop_timeout_s``; its exit
        status (None if it never started). Also after the child exited by itself."""
        process = self._process
        if process is None:
            return None
        self._stopping.set()
        try:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(self.stop_timeout_s)
        finally:  # also when a second signal interrupts the wait
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            if self._output is not None:
                self._output.close()
        return process.returncode

    def __enter__(self) -> ChildServer:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            return self.start()
        except BaseException:
            self._restore_sigterm()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._restore_sigterm()

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None


def _started_but_unservable(http: httpx.Client, answer: httpx.Response) -> bool:
    """Whether a 503 from /ready is final: the server finished starting (phase ``ready``)
    and has no model, or a model without any loaded version. (A held model, or one still
    loading, may yet become ready: that waits for the timeout.)"""
    try:
        if answer.status_code != 503 or answer.json().get("phase") != "ready":
            return False
        models = http.get("/v1/models").json()["models"]
    except (httpx.HTTPError, ValueError, KeyError, AttributeError):
        return False
    return not models or any(m.get("state") == "unavailable" for m in models)


def _status(code: int) -> str:
    if code < 0:
        return f"{code} ({signal.Signals(-code).name})"
    return str(code)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _parent_death_signal() -> Callable[[], None] | None:
    """For ``preexec_fn``: the child gets SIGTERM when its parent thread dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return set_death_signal
