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
import fcntl
import logging
import mmap
import os
import socket
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import orjson

from kernel import lane_wire as wire
from kernel.errors import (
    ConfigError,
    InvalidInput,
    MalformedRequest,
    RLServeError,
    ServiceUnavailable,
    internal_error,
    listed,
)
from serve.dataplane.routing import Route
from serve.frontends.oip.infer import Inference, call_budget_ms
from serve.frontends.oip.signature import InferCall, RequestedOutput, Signature
from serve.frontends.oip.tensors import DTYPES
from serve.status import http_headers, http_status

log = logging.getLogger("rlserve.lane")

_PEERCRED = struct.Struct("3i")  # pid, uid, gid
HELLO_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class LaneLimits:
    max_rows: int
    max_connections: int


class Lane:
    """One client's connection and slot."""

    def __init__(self, route: Route, hello: wire.Hello, layout: wire.Layout) -> None:
        self.model = route.model
        self.version = hello.version
        self.layout = layout
        self.sha256 = route.row_model().sha256  # the version the layout was checked against
        self.outputs = [RequestedOutput(area.name) for area in layout.outputs]
        self.fd = sealed_memfd(layout.size)
        self.slot = mmap.mmap(self.fd, layout.size)

    def close(self) -> None:
        """The slot's mapping and descriptor (the connection is its server's to close)."""
        self.slot.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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


def sealed_memfd(size: int) -> int:
    """An anonymous memfd of ``size`` bytes whose size nobody can change again.

    The seals (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``) hold for every process the
    descriptor reaches: a client that ``ftruncate``s its copy gets ``EPERM``, so the pages
    the server has mapped are never taken away under it (a shrunk mapping faults with
    SIGBUS, which would end the process). Writes stay allowed: they are the lane's data.
    """
    fd = os.memfd_create("rlserve-lane", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except OSError:
        os.close(fd)
        raise
    return fd


class LaneServer:
    """Listens at ``path`` while the process serves; closes and removes it at shutdown."""

    def __init__(
        self, path: Path, inference: Inference, limits: LaneLimits, draining: Callable[[], bool]
    ) -> None:
        self.path = path
        self.inference = inference
        self.limits = limits
        self._draining = draining
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
        log.info("local lane at %s", self.path)

    async def stop(self, grace_s: float) -> None:
        """No new lanes; calls in flight get ``grace_s`` to be answered; then every lane
        closes (its client sees the socket end) and the socket file goes."""
        if self._accepting is not None:
            self._accepting.cancel()
        if self._listener is not None:
            _unlink_own(self.path, self._inode)
            self._listener.close()
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
            if len(self._lanes) >= self.limits.max_connections:
                await _refuse(conn, ServiceUnavailable(
                    f"the local lane has {self.limits.max_connections} clients connected "
                    "(lane_max_connections); close a lane or raise the limit",
                    retry_after_s=1,
                ))  # fmt: skip
                continue
            task = asyncio.create_task(self._serve(conn), name="rlserve-lane")
            self._lanes.add(task)
            task.add_done_callback(self._lanes.discard)

    # ------------------------------------------------------------------ one lane

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        lane: Lane | None = None
        bells: Doorbells | None = None
        try:
            _check_peer(conn)
            hello = await asyncio.wait_for(_read_hello(loop, conn), HELLO_TIMEOUT_S)
            lane = self._open(hello)
            welcome = wire.frame({"layout": lane.layout.to_json()})
            fds = array.array("i", [lane.fd])
            conn.sendmsg([welcome], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            os.close(lane.fd)  # the mapping stays; the client holds its own descriptor
            lane.fd = -1
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
            else:
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
        route = self.inference.route(hello.model, _version_text(hello.version))
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
            if not 1 <= rows <= lane.layout.rows:
                raise InvalidInput(
                    f"rows: this lane carries 1 to {lane.layout.rows} rows a call, got {rows}"
                )
            route = self.inference.route(lane.model, _version_text(lane.version))
            served = route.row_model()
            if served.sha256 != lane.sha256:  # another version: its tensors may differ
                signature = self.inference.signature(served)
                if layout_of(route.model, signature, _hello_of(lane.layout)) != lane.layout:
                    _answer(slot, seq, wire.Status.RECONNECT)
                    return
                lane.sha256 = served.sha256
            parameters = {**_parameters(flags, seed), **_sequences(slot, lane.layout, rows)}
            call = InferCall(_inputs(slot, lane.layout, rows), parameters, lane.outputs)
            asked_ms = timeout_ms if timeout_ms > 0 else None
            budget = call_budget_ms(call, route.default_deadline_ms, asked_ms)
            deadline = self.inference.calls.turn.deadline(received_at, budget)
            self.inference.calls.admit(route, deadline, spent_on="reading it")
            request_id = f"lane-{id(lane):x}-{seq}"
            answer = await self.inference.run(route, call, request_id, received_at, deadline)
            for area, tensor in zip(lane.layout.outputs, answer.tensors, strict=True):
                data = np.ascontiguousarray(tensor.values, dtype=area.dtype)
                if data.nbytes != rows * area.row_bytes:
                    raise RuntimeError(f"output {area.name}: {data.nbytes} bytes for {rows} rows")
                slot[area.offset : area.offset + data.nbytes] = data.tobytes()
            response = answer.response
            _answer(slot, seq, wire.Status.OK, response.version, response.sha256)
        except RLServeError as exc:
            self.inference.refused(route, exc, received_at)
            _error(slot, seq, exc)
        except Exception as exc:  # a bug of ours: logged, and answered like any error
            log.exception("unhandled error on a local-lane call for %r", lane.model)
            error = internal_error(exc)
            self.inference.refused(route, error, received_at)
            _error(slot, seq, error)


# ---------------------------------------------------------------------- the layout


def layout_of(model: str, signature: Signature, hello: wire.Hello) -> wire.Layout:
    """The slot for a hello: the model's inputs, then the outputs asked for, ``rows`` each."""
    known = {o.name: o for o in signature.outputs}
    parameters = [name for name in known if name not in wire.OWN_OUTPUTS]
    names: list[str] = []
    for name in hello.outputs:
        names.extend(parameters if name == wire.DISTRIBUTION else [name])
    unknown = [name for name in names if name not in known]
    if unknown or not names or len(set(names)) != len(names):
        raise InvalidInput(
            f"outputs: expected distinct names drawn from {[*known, wire.DISTRIBUTION]}, "
            f"got {listed(list(hello.outputs))}"
        )
    inputs = [
        (
            meta.name,
            signature.key_of(meta.name),
            *_typed(meta.datatype, meta.shape),
            signature.field_of(meta.name),
        )
        for meta in signature.inputs
    ]
    if hello.sequences:
        inputs = _held(model, inputs, names)
    elif wire.STATE in known and wire.STATE not in names:
        names.append(wire.STATE)  # the client carries it to its next step
    outputs = [
        (name, None, *_typed(known[name].datatype, known[name].shape), None) for name in names
    ]
    input_areas, end = wire.place(inputs, hello.rows, wire.DATA_OFFSET)
    output_areas, end = wire.place(outputs, hello.rows, end)
    size = -(-end // mmap.PAGESIZE) * mmap.PAGESIZE
    return wire.Layout(model, hello.rows, size, tuple(input_areas), tuple(output_areas))


_SEQUENCE_AREAS = (("<i8", 8), ("|u1", 1), ("|u1", 1))  # per row: id, start, end


def _held(model: str, inputs: list[wire.Placed], names: list[str]) -> list[wire.Placed]:
    """A lane of server-held sequences: the observations (and masks), then each row's
    sequence id, start and end; the client-held memory's inputs and output are not there."""
    fields = {field for *_, field in inputs}
    if not set(wire.CLIENT_HELD) <= fields:
        raise InvalidInput(
            f"sequences: model {model!r} is not a recurrent policy: it has no memory for the "
            "server to hold; say hello without sequences"
        )
    if wire.STATE in names:
        raise InvalidInput(
            f"outputs: {wire.STATE!r}: the server holds the sequences' memory on this lane; "
            "leave it out"
        )
    kept = [placed for placed in inputs if placed[-1] not in wire.CLIENT_HELD]
    sequence = [
        (field, None, dtype, (), itemsize, field)
        for field, (dtype, itemsize) in zip(wire.SEQUENCE_FIELDS, _SEQUENCE_AREAS, strict=True)
    ]
    return kept + sequence


def _typed(datatype: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...], int]:
    dtype = DTYPES[datatype]
    return dtype.str, tuple(shape[1:]), dtype.itemsize


def _hello_of(layout: wire.Layout) -> wire.Hello:
    """A hello that makes this layout again, if the model's tensors are the same."""
    outputs = tuple(a.name for a in layout.outputs)
    sequences = any(a.field in wire.SEQUENCE_FIELDS for a in layout.inputs)
    return wire.Hello(layout.model, None, layout.rows, outputs, sequences=sequences)


def _inputs(slot: mmap.mmap, layout: wire.Layout, rows: int) -> dict[str, np.ndarray]:
    """Each input's rows, copied out of the slot (the client may write it again at once)."""
    inputs = {}
    for area in layout.inputs:
        if area.field in wire.SEQUENCE_FIELDS:
            continue  # parameters: _sequences
        count = rows * area.row_bytes // np.dtype(area.dtype).itemsize
        view = np.frombuffer(slot, area.dtype, count, area.offset)
        inputs[area.name] = view.reshape(rows, *area.shape).copy()
    return inputs


def _sequences(slot: mmap.mmap, layout: wire.Layout, rows: int) -> dict[str, object]:
    """The rows' sequence ids, starts and ends, as the predict parameters of server-held
    sequences (none on a lane without them)."""
    parameters: dict[str, object] = {}
    for area in layout.inputs:
        if area.field not in wire.SEQUENCE_FIELDS:
            continue
        values = np.frombuffer(slot, area.dtype, rows, area.offset).copy()
        parameters[area.field] = values.tolist() if area.dtype == "<i8" else values != 0
    return parameters


def _parameters(flags: int, seed: int) -> dict[str, object]:
    given = wire.Flags(flags & (wire.Flags.DETERMINISTIC | wire.Flags.SEEDED))
    parameters: dict[str, object] = {"deterministic": wire.Flags.DETERMINISTIC in given}
    if wire.Flags.SEEDED in given:
        parameters["seed"] = seed
    return parameters


def _answer(
    slot: mmap.mmap, seq: int, status: wire.Status, version: int = 0, sha256: str = "",
    message: int = 0, retry_after_s: float = 0.0, http: int = 0,
) -> None:  # fmt: skip
    wire.ANSWER.pack_into(
        slot,
        wire.ANSWER_OFFSET,
        seq,
        status,
        message,
        version,
        sha256.encode(),
        retry_after_s,
        http,
    )


def _error(slot: mmap.mmap, seq: int, error: RLServeError) -> None:
    body = orjson.dumps({"code": error.code.value, "message": error.message})[: wire.MESSAGE_BYTES]
    slot[wire.MESSAGE_OFFSET : wire.MESSAGE_OFFSET + len(body)] = body
    retry = http_headers(error).get("Retry-After")
    _answer(
        slot, seq, wire.Status.ERROR, message=len(body),
        retry_after_s=float(retry) if retry else 0.0, http=http_status(error),
    )  # fmt: skip


def _version_text(version: int | None) -> str | None:
    return None if version is None else str(version)


# ---------------------------------------------------------------------- the socket


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
