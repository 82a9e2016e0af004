"""The local lane's server: a Unix socket whose clients call with arrays in shared memory.

Each connection is one :class:`Lane`: a hello names the model, the most rows a call carries
and the outputs wanted; the server answers with the slot's layout and the slot itself (an
anonymous memfd, passed over the socket), then serves one call per doorbell byte
(``kernel.lane_wire``). A call takes the same steps as an Open Inference Protocol
call (``serve.frontends.oip.infer.Inference``: deadline, admission, preparation,
submission), so its rows join the same batches as HTTP and gRPC rows, and count in the
same metrics and records.

Safety: the socket file is the server user's alone (0600), and a peer of another user is
refused (``SO_PEERCRED``); each lane's slot is sized by the server from the model's
contract and bounded by settings (``lane_max_rows``, ``lane_max_connections``), and every
offset read or written is the server's own. The slot is sealed at its size before it is
passed (:func:`sealed_memfd`): a client cannot shrink or grow it under the server's mapping.
A client can only put values in its rows.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import cast

import orjson

from kernel import lane_wire as wire
from kernel.errors import (
    ConfigError,
    InvalidInput,
    MalformedRequest,
    RLServeError,
    ServiceUnavailable,
    internal_error,
)
from serve.dataplane.routing import Route
from serve.frontends.lane.engine import LaneEngine
from serve.frontends.lane.slot import (
    Lane,
    call_id,
    check_rows,
    inputs_of,
    layout_of,
    parameters_of,
    sequences_of,
    version_text,
    write_answer,
    write_error,
    write_outputs,
)
from serve.frontends.oip.infer import Inference
from serve.frontends.oip.signature import InferCall
from serve.status import http_status

log = logging.getLogger("rlserve.lane")

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
HELLO_TIMEOUT_S = 5.0


class LaneServing(StrEnum):
    """Where lane calls are served (the ``lane_serving`` setting)."""

    LOOP = "loop"  # on the event loop, through the dynamic batcher, as HTTP and gRPC calls
    THREAD = "thread"  # by the serving thread, every lane that rang in one batch


@dataclass(frozen=True, slots=True)
class LaneLimits:
    max_rows: int
    max_connections: int


class Doorbells(asyncio.Protocol):
    """A lane's socket once its slot is passed: each byte in rings for one call, and one
    byte out answers it. The event loop reads the socket for as long as the lane lives,
    so a call costs no reader added and removed (as ``sock_recv`` would per call)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._rung = 0  # calls rung and not yet taken
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._rung += len(data)
        self._wake()

    def eof_received(self) -> bool:
        self._closed = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._wake()

    async def rung(self) -> bool:
        """Wait for the next call; False once the client has closed the lane."""
        while not self._rung:
            if self._closed:
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        self._rung -= 1
        return True

    def answer(self) -> None:
        if self._transport is not None and not self._closed:
            self._transport.write(wire.DOORBELL)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class LaneServer:
    """Listens at ``path`` while the process serves; closes and removes it at shutdown."""

    def __init__(
        self,
        path: Path,
        inference: Inference,
        limits: LaneLimits,
        draining: Callable[[], bool],
        *,
        serving: LaneServing = LaneServing.LOOP,
        spin_us: float = 0.0,
    ) -> None:
        self.path = path
        self.inference = inference
        self.limits = limits
        self.serving = serving
        self.spin_us = spin_us
        self._draining = draining
        self._engine: LaneEngine | None = None  # the serving thread (LaneServing.THREAD)
        self._listener: socket.socket | None = None
        self._inode = 0
        self._accepting: asyncio.Task[None] | None = None
        self._lanes: set[asyncio.Task[None]] = set()
        self._busy: set[asyncio.Task[None]] = set()  # lanes with a call in flight

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        self._listener = bind(self.path)
        self._inode = os.stat(self.path).st_ino
        self._accepting = asyncio.create_task(self._accept(), name="rlserve-lane-accept")
        if self.serving is LaneServing.THREAD:
            loop = asyncio.get_running_loop()
            self._engine = LaneEngine(self.inference, loop, spin_us=self.spin_us)
            self._engine.start()
        log.info("local lane at %s (calls served on the %s)", self.path, self.serving.value)

    async def stop(self, grace_s: float) -> None:
        """No new lanes; calls in flight get ``grace_s`` to be answered; then every lane
        closes (its client sees the socket end) and the socket file goes."""
        if self._accepting is not None:
            self._accepting.cancel()
        if self._listener is not None:
            _unlink_own(self.path, self._inode)
            self._listener.close()
        if self._engine is not None:
            await self._engine.stop(grace_s)
        if self._busy:
            await asyncio.wait(list(self._busy), timeout=grace_s)
        for task in list(self._lanes):
            task.cancel()
        if self._lanes:
            await asyncio.wait(list(self._lanes), timeout=1.0)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            conn, _ = await loop.sock_accept(self._listener)
            if self._connected() >= self.limits.max_connections:
                await _refuse(conn, ServiceUnavailable(
                    f"the local lane has {self.limits.max_connections} clients connected "
                    "(lane_max_connections); close a lane or raise the limit",
                    retry_after_s=1,
                ))  # fmt: skip
                continue
            task = asyncio.create_task(self._serve(conn), name="rlserve-lane")
            self._lanes.add(task)
            task.add_done_callback(self._lanes.discard)

    def _connected(self) -> int:
        return len(self._lanes) + (self._engine.lanes if self._engine is not None else 0)

    # ------------------------------------------------------------------ one lane

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        lane: Lane | None = None
        bells: Doorbells | None = None
        handed = False  # to the serving thread, with its lane
        try:
            _check_peer(conn)
            hello = await asyncio.wait_for(_read_hello(loop, conn), HELLO_TIMEOUT_S)
            lane = self._open(hello)
            welcome = wire.frame({"layout": lane.layout.to_json()})
            fds = array.array("i", [lane.fd])
            conn.sendmsg([welcome], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            os.close(lane.fd)  # the mapping stays; the client holds its own descriptor
            lane.fd = -1
            if self._engine is not None and not hello.sequences:
                self._engine.add(lane, conn)  # the thread serves and closes it from now on
                lane = None
                handed = True
                return
            _, bells = await loop.connect_accepted_socket(Doorbells, sock=conn)
            await self._calls(lane, bells)
        except RLServeError as exc:
            if lane is None:
                await _refuse(conn, exc)
        except (ConnectionError, TimeoutError, OSError) as exc:
            log.debug("local lane closed: %s", exc)
        except Exception as exc:  # a bug of ours: logged, and the hello answered
            log.exception("unhandled error on a local lane")
            if lane is None:
                await _refuse(conn, internal_error(exc))
        finally:
            if bells is not None:
                bells.close()  # the transport owns the socket now, and closes it
            elif not handed:
                conn.close()
            if lane is not None:
                lane.close()

    async def _calls(self, lane: Lane, bells: Doorbells) -> None:
        """Serve the lane's calls, one per doorbell, until its client closes it."""
        task = asyncio.current_task()
        assert task is not None
        while await bells.rung():
            self._busy.add(task)
            try:
                await self._call(lane)
            finally:
                self._busy.discard(task)
            bells.answer()

    def _open(self, hello: wire.Hello) -> Lane:
        if self._draining():
            raise ServiceUnavailable(
                "the server is draining; connect to another replica", retry_after_s=1
            )
        if not 1 <= hello.rows <= self.limits.max_rows:
            raise InvalidInput(
                f"rows: a lane carries 1 to {self.limits.max_rows} rows a call "
                f"(lane_max_rows), got {hello.rows}"
            )
        route = self.inference.route(hello.model, version_text(hello.version))
        signature = self.inference.signature(route.row_model())
        layout = layout_of(route.model, signature, hello)
        return Lane(route, hello, layout)

    async def _call(self, lane: Lane) -> None:
        """One call: rows from the slot, through the row-call steps, outputs to the slot."""
        received_at = time.monotonic()
        slot = lane.slot
        seq, rows, flags, seed, timeout_ms = wire.REQUEST.unpack_from(slot, wire.REQUEST_OFFSET)
        route: Route | None = None
        try:
            check_rows(lane.layout, rows)
            route = self.inference.route(lane.model, version_text(lane.version), lane.episode_key)
            served = route.row_model()
            if not lane.follows(served.sha256, self.inference.signature(served)):
                write_answer(slot, seq, wire.Status.RECONNECT)
                return
            parameters = {**parameters_of(flags, seed), **sequences_of(slot, lane.layout, rows)}
            call = InferCall(inputs_of(slot, lane.layout, rows), parameters, lane.outputs)
            asked_ms = timeout_ms if timeout_ms > 0 else None
            deadline = self.inference.admitted(route, call, received_at, asked_ms)
            request_id = call_id(lane, seq)
            answer = await self.inference.run(route, call, request_id, received_at, deadline)
            write_outputs(slot, lane.layout, answer.tensors, rows)
            response = answer.response
            write_answer(slot, seq, wire.Status.OK, response.version, response.sha256)
        except RLServeError as exc:
            self.inference.refused(route, exc, received_at)
            write_error(slot, seq, exc)
        except Exception as exc:  # a bug of ours: logged, and answered like any error
            log.exception("unhandled error on a local-lane call for %r", lane.model)
            error = internal_error(exc)
            self.inference.refused(route, error, received_at)
            write_error(slot, seq, error)


def bind(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, the server user's alone (0600). A socket file
    left by a server that is gone is replaced; one a live server listens on, or any other
    file, is refused."""
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ConfigError(f"lane {str(path)!r} exists and is not a socket; give another path")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # left by a server that is gone
        else:
            raise ConfigError(
                f"lane {str(path)!r}: another server listens there; give another path"
            )
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, 0o600)  # before listen(): nobody connects in between
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise ConfigError(
            f"lane {str(path)!r}: {exc.strerror}; give a path in a directory this user may write"
        ) from exc
    listener.setblocking(False)
    return listener


def _unlink_own(path: Path, inode: int) -> None:
    """Remove the socket file, unless another server has bound that path since."""
    try:
        if os.stat(path).st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass


def _check_peer(conn: socket.socket) -> None:
    _, uid, _ = _PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    if uid not in (os.getuid(), 0):
        raise ServiceUnavailable("the local lane serves its own user's processes only")


async def _read_hello(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> wire.Hello:
    head = await _read_exactly(loop, conn, wire.FRAME.size)
    try:
        length = wire.frame_length(head)
    except ValueError as exc:
        raise MalformedRequest(f"hello: {exc}") from None
    try:
        given = orjson.loads(await _read_exactly(loop, conn, length))
        hello = wire.Hello(
            given.get("model"), given.get("version"), given["rows"], tuple(given["outputs"]),
            sequences=given.get("sequences", False),
        )  # fmt: skip
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise MalformedRequest(
            'hello: expected JSON {"model", "version", "rows", "outputs", "sequences"}'
        ) from None
    if hello.model is not None and not isinstance(hello.model, str):
        raise MalformedRequest("hello: model is a name or null")
    if hello.version is not None and (
        isinstance(hello.version, bool) or not isinstance(hello.version, int) or hello.version < 1
    ):
        raise MalformedRequest("hello: version is a positive integer or null")
    if isinstance(hello.rows, bool) or not isinstance(hello.rows, int):
        raise MalformedRequest("hello: rows is an integer")
    if not all(isinstance(name, str) for name in hello.outputs):
        raise MalformedRequest("hello: outputs is a list of names")
    if not isinstance(hello.sequences, bool):
        raise MalformedRequest("hello: sequences is true or false")
    return hello


async def _read_exactly(loop: asyncio.AbstractEventLoop, conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = await loop.sock_recv(conn, n - len(data))
        if not more:
            raise ConnectionError("the client closed the lane during its hello")
        data += more
    return data


async def _refuse(conn: socket.socket, error: RLServeError) -> None:
    """Answer a hello with an error and close."""
    try:
        conn.setblocking(False)
        body = {
            "error": {
                "code": error.code.value,
                "message": error.message,
                "status": http_status(error),
            }
        }
        await asyncio.get_running_loop().sock_sendall(conn, wire.frame(body))
    except OSError:
        pass
    finally:
        conn.close()
