"""The IPC floor: what one small request and its answer cost between two processes.

For each transport a server process pinned to the first core echoes a request of
``--payload`` bytes (16 by default: one CartPole observation, four float32) back, and a
client process pinned to the second core calls it again and again for ``--seconds``. The
client times every round trip (``time.perf_counter_ns``); both sides count their CPU time
(``time.process_time``). Nothing else runs in either process: no asyncio, no parsing, no
model, so a row is the least a call over that transport can cost here.

Transports (a library that is not installed is skipped with one line saying so):

- the lane design (serve/frontends/lane): a slot in an anonymous memfd passed over a Unix
  socket (``socket.send_fds``), one doorbell byte each way with blocking ``recv``;
- the same slot with one eventfd per direction as the doorbell;
- ``multiprocessing.shared_memory`` with the socket doorbell;
- ``posix_ipc`` shared memory with two named semaphores (``pip install posix-ipc``);
- two ``faster_fifo`` queues (``pip install faster-fifo``);
- ``iceoryx2`` request-response with two event services as doorbells
  (``pip install iceoryx2``);
- for reference, the lane design with a client that spins on a sequence number in the slot
  instead of waiting for the answer's doorbell (it burns the client's core).

Run: ``python -m bench.ipc [--seconds 3] [--payload 16]``; it prints a markdown table.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.util
import mmap
import multiprocessing as mp
import os
import socket
import struct
import tempfile
import time
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

# The slot: an op byte, the request's and the answer's sequence numbers, then the request's
# bytes and the answer's, each on its own cache line.
OP = 0
REQUEST_SEQ = 8
ANSWER_SEQ = 16
REQUEST = 64
CALL = 1
STOP = 2
LINE = 64

WARMUP_CALLS = 1_000
SETUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
LANE_SERVER_US = 250  # the lane's server time per call today (docs/lane.md)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Layout:
    """Where a request of ``payload`` bytes and its answer lie in the slot."""

    payload: int

    @property
    def answer(self) -> int:
        return REQUEST + _round_up(self.payload, LINE)

    @property
    def size(self) -> int:
        return _round_up(self.answer + self.payload, mmap.PAGESIZE)


# --- the two ends ----------------------------------------------------------------------


class Server(ABC):
    """The serving end of one transport, opened in the server process."""

    @abstractmethod
    def serve(self) -> int:
        """Echo requests until the client says stop; the number of calls answered."""

    @abstractmethod
    def close(self) -> None:
        """Release what the end holds (the process is about to exit)."""


class Client(ABC):
    """The calling end of one transport, opened in the client process."""

    @abstractmethod
    def call(self, request: bytes) -> bytes:
        """Send ``request``, wait for the answer and return its bytes."""

    @abstractmethod
    def stop(self) -> None:
        """Tell the server to return from ``serve``."""

    @abstractmethod
    def close(self) -> None:
        """Release what the end holds (the process is about to exit)."""


class Transport(ABC):
    """How to open both ends; ``prepare`` and ``cleanup`` run in the parent, around them."""

    name: str
    notes: str
    library: str | None = None  # the module it needs, where one is needed
    spinning: bool = False

    def prepare(self, layout: Layout) -> None:
        """Create what both ends find (a listening socket, named objects), before the fork."""
        self.layout = layout

    @abstractmethod
    def server(self) -> Server:
        """Open the serving end (in the server process)."""

    @abstractmethod
    def client(self) -> Client:
        """Open the calling end (in the client process)."""

    @abstractmethod
    def cleanup(self) -> None:
        """Remove what ``prepare`` created, once both processes have ended."""


# --- doorbells and the slot's two ends -----------------------------------------------------


class Doorbell(ABC):
    """One end's way to wake the other and to wait to be woken."""

    @abstractmethod
    def ring(self) -> None:
        """Wake the other end."""

    @abstractmethod
    def wait(self) -> None:
        """Block until the other end rings."""

    @abstractmethod
    def close(self) -> None:
        """Release the doorbell's descriptors or handles."""


class SocketBell(Doorbell):
    """One byte over a connected Unix socket, read with a blocking ``recv``."""

    def __init__(self, sock: socket.socket, *, rings: bool = True) -> None:
        self._sock = sock
        self._rings = rings  # a spinning client is never rung

    def ring(self) -> None:
        if self._rings:
            self._sock.send(b"\x01")

    def wait(self) -> None:
        if not self._sock.recv(1):
            raise ConnectionError("the other end closed the socket")

    def close(self) -> None:
        self._sock.close()


class EventfdBell(Doorbell):
    """Two eventfds: this end waits on one and rings the other."""

    def __init__(self, waits_on: int, rings: int) -> None:
        self._waits_on = waits_on
        self._rings = rings

    def ring(self) -> None:
        os.eventfd_write(self._rings, 1)

    def wait(self) -> None:
        os.eventfd_read(self._waits_on)

    def close(self) -> None:
        os.close(self._waits_on)
        os.close(self._rings)


class SemaphoreBell(Doorbell):
    """Two posix_ipc semaphores: this end acquires one and releases the other."""

    def __init__(self, waits_on: Any, rings: Any) -> None:
        self._waits_on = waits_on
        self._rings = rings

    def ring(self) -> None:
        self._rings.release()

    def wait(self) -> None:
        self._waits_on.acquire()

    def close(self) -> None:
        self._waits_on.close()
        self._rings.close()


class Slot:
    """The shared slot as a memoryview, with what must be closed when it goes."""

    def __init__(self, view: memoryview, release: Callable[[], None]) -> None:
        self.view = view
        self._release = release

    @classmethod
    def mapped(cls, fd: int, size: int) -> Slot:
        """Map ``size`` bytes of ``fd`` (the descriptor may be closed afterwards)."""
        memory = mmap.mmap(fd, size)
        view = memoryview(memory)

        def release() -> None:
            view.release()
            memory.close()

        return cls(view, release)

    def close(self) -> None:
        self._release()


class SlotServer(Server):
    """The server of every slot transport: wait, copy the request to the answer, ring."""

    def __init__(self, slot: Slot, layout: Layout, bell: Doorbell) -> None:
        self._slot = slot
        self._layout = layout
        self._bell = bell

    def serve(self) -> int:
        view, bell = self._slot.view, self._bell
        request = slice(REQUEST, REQUEST + self._layout.payload)
        answer = slice(self._layout.answer, self._layout.answer + self._layout.payload)
        calls = 0
        while True:
            bell.wait()
            if view[OP] == STOP:
                return calls
            view[answer] = view[request]
            view[ANSWER_SEQ : ANSWER_SEQ + 8] = view[REQUEST_SEQ : REQUEST_SEQ + 8]
            bell.ring()
            calls += 1

    def close(self) -> None:
        self._bell.close()
        self._slot.close()


class SlotClient(Client):
    """Write the request and its sequence number into the slot, ring, wait for the answer."""

    def __init__(self, slot: Slot, layout: Layout, bell: Doorbell) -> None:
        self._slot = slot
        self._bell = bell
        self._request = slice(REQUEST, REQUEST + layout.payload)
        self._answer = slice(layout.answer, layout.answer + layout.payload)
        self._seq = 0

    def _send(self, request: bytes) -> None:
        self._seq += 1
        view = self._slot.view
        view[self._request] = request
        struct.pack_into("<Q", view, REQUEST_SEQ, self._seq)
        view[OP] = CALL
        self._bell.ring()

    def call(self, request: bytes) -> bytes:
        self._send(request)
        self._bell.wait()
        return bytes(self._slot.view[self._answer])

    def stop(self) -> None:
        self._slot.view[OP] = STOP
        self._bell.ring()

    def close(self) -> None:
        self._bell.close()
        self._slot.close()


class SpinningClient(SlotClient):
    """As ``SlotClient``, but it reads the answer's sequence number until it is its own.

    The server writes the answer's bytes before its sequence number, and x86 keeps stores
    in order, so the bytes are there once the number is.
    """

    def call(self, request: bytes) -> bytes:
        self._send(request)
        view, seq = self._slot.view, self._seq
        while struct.unpack_from("<Q", view, ANSWER_SEQ)[0] != seq:
            pass
        return bytes(view[self._answer])


# --- the transports --------------------------------------------------------------------


class UnixSocketTransport(Transport):
    """A listening Unix socket at a path, made before the fork; the server accepts on it."""

    def prepare(self, layout: Layout) -> None:
        super().prepare(layout)
        self._dir = tempfile.mkdtemp(prefix="rlserve-ipc-")
        self.path = str(Path(self._dir) / "lane.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(1)

    def accept(self) -> socket.socket:
        conn, _ = self._listener.accept()
        self._listener.close()
        return conn

    def connect(self) -> socket.socket:
        self._listener.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        return sock

    def cleanup(self) -> None:
        self._listener.close()
        Path(self.path).unlink(missing_ok=True)
        Path(self._dir).rmdir()


def _memfd_slot(size: int) -> int:
    """An anonymous memfd of ``size`` bytes: nothing named anywhere, gone with its last user."""
    fd = os.memfd_create("rlserve-ipc-slot", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def _map_and_close(fd: int, size: int) -> Slot:
    slot = Slot.mapped(fd, size)
    os.close(fd)
    return slot


class LaneTransport(UnixSocketTransport):
    """The lane: the server makes a memfd slot, passes it over the socket, rings by byte."""

    name = "lane design: memfd + socket byte"
    notes = "unrelated processes, found by a socket path; nothing named in /dev/shm"
    calling: type[SlotClient] = SlotClient

    def server(self) -> Server:
        conn = self.accept()
        fd = _memfd_slot(self.layout.size)
        socket.send_fds(conn, [b"s"], [fd])
        slot = _map_and_close(fd, self.layout.size)
        return SlotServer(slot, self.layout, SocketBell(conn, rings=not self.spinning))

    def client(self) -> Client:
        sock = self.connect()
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
        slot = _map_and_close(fds[0], self.layout.size)
        return self.calling(slot, self.layout, SocketBell(sock))


class SpinningLaneTransport(LaneTransport):
    """The lane design whose client spins on the answer's sequence number."""

    name = "lane design, client spinning"
    notes = "the server still blocks on its doorbell and rings nothing; the client burns its core"
    calling = SpinningClient
    spinning = True


class EventfdTransport(UnixSocketTransport):
    """The lane's memfd slot, with two eventfds passed beside it as the doorbells."""

    name = "memfd + eventfd pair"
    notes = "as the lane; the eventfds travel with the memfd over the socket"

    def server(self) -> Server:
        conn = self.accept()
        fd = _memfd_slot(self.layout.size)
        to_server, to_client = os.eventfd(0, os.EFD_CLOEXEC), os.eventfd(0, os.EFD_CLOEXEC)
        socket.send_fds(conn, [b"s"], [fd, to_server, to_client])
        conn.close()
        slot = _map_and_close(fd, self.layout.size)
        return SlotServer(slot, self.layout, EventfdBell(waits_on=to_server, rings=to_client))

    def client(self) -> Client:
        sock = self.connect()
        _, fds, _, _ = socket.recv_fds(sock, 1, 3)
        sock.close()
        fd, to_server, to_client = fds
        slot = _map_and_close(fd, self.layout.size)
        return SlotClient(slot, self.layout, EventfdBell(waits_on=to_client, rings=to_server))


class SharedMemoryTransport(UnixSocketTransport):
    """``multiprocessing.shared_memory`` found by name, with the lane's socket doorbell."""

    name = "multiprocessing.shared_memory + socket byte"
    notes = (
        "names a file in /dev/shm; after a SIGKILL only Python's resource tracker, "
        "if it outlives the owner, unlinks it"
    )

    def prepare(self, layout: Layout) -> None:
        from multiprocessing.shared_memory import SharedMemory

        super().prepare(layout)
        self._owner = SharedMemory(create=True, size=layout.size)

    def _attach(self) -> Slot:
        from multiprocessing.shared_memory import SharedMemory

        memory = SharedMemory(self._owner.name)
        view = memory.buf
        assert view is not None  # None only once closed

        def release() -> None:
            view.release()
            memory.close()

        return Slot(view, release)

    def server(self) -> Server:
        return SlotServer(self._attach(), self.layout, SocketBell(self.accept()))

    def client(self) -> Client:
        sock = self.connect()
        return SlotClient(self._attach(), self.layout, SocketBell(sock))

    def cleanup(self) -> None:
        super().cleanup()
        self._owner.close()
        self._owner.unlink()


class PosixIpcTransport(Transport):
    """posix_ipc shared memory and two semaphores, each found by its name."""

    name = "posix_ipc: shm + 2 semaphores"
    notes = "three named objects in /dev/shm (unlinked at the end; a SIGKILL leaves them)"
    library = "posix_ipc"

    def prepare(self, layout: Layout) -> None:
        super().prepare(layout)
        posix_ipc = importlib.import_module("posix_ipc")
        prefix = f"/rlserve-ipc-{os.getpid()}"
        self._names = (f"{prefix}-slot", f"{prefix}-request", f"{prefix}-answer")
        memory = posix_ipc.SharedMemory(self._names[0], posix_ipc.O_CREX, size=layout.size)
        memory.close_fd()
        for name in self._names[1:]:
            posix_ipc.Semaphore(name, posix_ipc.O_CREX, initial_value=0).close()

    def _open(self) -> tuple[Slot, Any, Any]:
        posix_ipc = importlib.import_module("posix_ipc")
        memory = posix_ipc.SharedMemory(self._names[0])
        slot = Slot.mapped(memory.fd, self.layout.size)
        memory.close_fd()
        return slot, posix_ipc.Semaphore(self._names[1]), posix_ipc.Semaphore(self._names[2])

    def server(self) -> Server:
        slot, request, answer = self._open()
        return SlotServer(slot, self.layout, SemaphoreBell(waits_on=request, rings=answer))

    def client(self) -> Client:
        slot, request, answer = self._open()
        return SlotClient(slot, self.layout, SemaphoreBell(waits_on=answer, rings=request))

    def cleanup(self) -> None:
        posix_ipc = importlib.import_module("posix_ipc")
        posix_ipc.unlink_shared_memory(self._names[0])
        for name in self._names[1:]:
            posix_ipc.unlink_semaphore(name)


class FifoServer(Server):
    def __init__(self, requests: Any, answers: Any) -> None:
        self._requests = requests
        self._answers = answers

    def serve(self) -> int:
        requests, answers = self._requests, self._answers
        calls = 0
        while True:
            message = requests.get(timeout=1e9)
            if not message:
                return calls
            answers.put(message)
            calls += 1

    def close(self) -> None:
        """Nothing: the parent closes the queues."""


class FifoClient(Client):
    def __init__(self, requests: Any, answers: Any) -> None:
        self._requests = requests
        self._answers = answers

    def call(self, request: bytes) -> bytes:
        self._requests.put(request)
        answer: bytes = self._answers.get(timeout=1e9)
        return answer

    def stop(self) -> None:
        self._requests.put(b"")

    def close(self) -> None:
        """Nothing: the parent closes the queues."""


class FasterFifoTransport(Transport):
    """Two faster_fifo queues (request, answer) made in the parent, inherited at the fork."""

    name = "faster-fifo: 2 queues"
    notes = "processes of one parent only (the queues are inherited); bytes, no pickling"
    library = "faster_fifo"

    def prepare(self, layout: Layout) -> None:
        super().prepare(layout)
        faster_fifo = importlib.import_module("faster_fifo")
        self._requests = faster_fifo.Queue(max_size_bytes=1 << 16, loads=bytes, dumps=bytes)
        self._answers = faster_fifo.Queue(max_size_bytes=1 << 16, loads=bytes, dumps=bytes)

    def server(self) -> Server:
        return FifoServer(self._requests, self._answers)

    def client(self) -> Client:
        return FifoClient(self._requests, self._answers)

    def cleanup(self) -> None:
        self._requests.close()
        self._answers.close()


class IceoryxPorts:
    """One process's iceoryx2 node: the request-response port and the two event ports."""

    def __init__(self, service: str, layout: Layout, serving: bool) -> None:
        iox2 = importlib.import_module("iceoryx2")
        iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
        message = ctypes.c_uint8 * (REQUEST + layout.payload)
        self.node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
        calls = self._service(iox2, service).request_response(message, message).open_or_create()
        requests = self._service(iox2, f"{service}/request").event().open_or_create()
        answers = self._service(iox2, f"{service}/answer").event().open_or_create()
        if serving:
            self.port = calls.server_builder().create()
            self.listener = requests.listener_builder().create()
            self.notifier = answers.notifier_builder().create()
        else:
            self.port = calls.client_builder().create()
            self.listener = answers.listener_builder().create()
            self.notifier = requests.notifier_builder().create()

    def _service(self, iox2: Any, name: str) -> Any:
        return self.node.service_builder(iox2.ServiceName.new(name))

    def close(self) -> None:
        """Delete the ports, then drop the node: its services go with their last user."""
        for port in (self.port, self.listener, self.notifier):
            port.delete()
        del self.node


class IceoryxServer(Server):
    def __init__(self, ports: IceoryxPorts, payload: int) -> None:
        self._ports = ports
        self._size = REQUEST + payload

    def serve(self) -> int:
        server, listener, notifier = self._ports.port, self._ports.listener, self._ports.notifier
        calls = 0
        while True:
            listener.blocking_wait()
            while (request := server.receive()) is not None:
                if ctypes.c_uint8.from_address(request.payload_ptr).value == STOP:
                    request.delete()
                    return calls
                answer = request.loan_uninit()
                ctypes.memmove(answer.payload_ptr, request.payload_ptr, self._size)
                answer.assume_init().send()
                request.delete()
                notifier.notify()
                calls += 1

    def close(self) -> None:
        self._ports.close()


class IceoryxClient(Client):
    def __init__(self, ports: IceoryxPorts, payload: int) -> None:
        self._ports = ports
        self._payload = payload

    def _send(self, op: int, request: bytes) -> Any:
        loan = self._ports.port.loan_uninit()
        ctypes.memset(loan.payload_ptr, op, 1)
        ctypes.memmove(loan.payload_ptr + REQUEST, request, len(request))
        pending = loan.assume_init().send()
        self._ports.notifier.notify()
        return pending

    def call(self, request: bytes) -> bytes:
        pending = self._send(CALL, request)
        while True:
            self._ports.listener.blocking_wait()
            answer = pending.receive()
            if answer is not None:
                break
        data = ctypes.string_at(answer.payload_ptr + REQUEST, self._payload)
        answer.delete()
        pending.delete()
        return data

    def stop(self) -> None:
        self._send(STOP, bytes(self._payload)).delete()

    def close(self) -> None:
        self._ports.close()


class IceoryxTransport(Transport):
    """iceoryx2 request-response; two event services wake the sides (its ports only poll)."""

    name = "iceoryx2: request-response + 2 events"
    notes = (
        "services found by name; after a SIGKILL its files stay in /dev/shm and "
        "/tmp/iceoryx2 until the next iceoryx2 node cleans up dead nodes"
    )
    library = "iceoryx2"

    def prepare(self, layout: Layout) -> None:
        super().prepare(layout)
        self._service = f"rlserve-ipc/{os.getpid()}"

    def server(self) -> Server:
        ports = IceoryxPorts(self._service, self.layout, serving=True)
        return IceoryxServer(ports, self.layout.payload)

    def client(self) -> Client:
        ports = IceoryxPorts(self._service, self.layout, serving=False)
        return IceoryxClient(ports, self.layout.payload)

    def cleanup(self) -> None:
        """Nothing: each end deletes its ports and node, and the last one the services."""


TRANSPORTS: tuple[type[Transport], ...] = (
    LaneTransport,
    EventfdTransport,
    SharedMemoryTransport,
    PosixIpcTransport,
    FasterFifoTransport,
    IceoryxTransport,
    SpinningLaneTransport,
)


# --- measuring -------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientResult:
    calls: int
    wall_s: float
    cpu_s: float
    p50_us: float
    p99_us: float


@dataclass(frozen=True)
class ServerResult:
    calls: int  # the warm-up's calls included: its CPU time covers them too
    cpu_s: float


@dataclass(frozen=True)
class Failed:
    error: str


@dataclass(frozen=True)
class Row:
    transport: Transport
    client: ClientResult | Failed
    server: ServerResult | Failed


def _percentile_us(sorted_ns: Sequence[int], fraction: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(fraction * len(sorted_ns)))] / 1_000


def measure(client: Client, request: bytes, seconds: float) -> ClientResult:
    """Call as fast as the transport answers for ``seconds``, after a short warm-up."""
    for _ in range(WARMUP_CALLS):
        client.call(request)
    latencies = array("q")
    cpu_start = time.process_time()
    start = time.perf_counter_ns()
    deadline = start + int(seconds * 1e9)
    while True:
        before = time.perf_counter_ns()
        answer = client.call(request)
        after = time.perf_counter_ns()
        latencies.append(after - before)
        if after >= deadline:
            break
    cpu_s = time.process_time() - cpu_start
    if answer != request:
        raise RuntimeError(f"the answer {answer!r} is not the request {request!r}")
    ordered = sorted(latencies)
    return ClientResult(
        calls=len(ordered),
        wall_s=(after - start) / 1e9,
        cpu_s=cpu_s,
        p50_us=_percentile_us(ordered, 0.50),
        p99_us=_percentile_us(ordered, 0.99),
    )


def _serve_main(
    transport: Transport, core: int, ready: Event, served: Event, out: Connection
) -> None:
    os.sched_setaffinity(0, {core})
    server: Server | None = None
    try:
        server = transport.server()
        ready.set()
        cpu_start = time.process_time()
        calls = server.serve()
        out.send(ServerResult(calls=calls, cpu_s=time.process_time() - cpu_start))
    except Exception as error:  # reported in the table, not raised in a child
        out.send(Failed(f"server: {error!r}"))
    finally:
        served.set()
        if server is not None:
            server.close()


def _call_main(
    transport: Transport,
    core: int,
    ready: Event,
    served: Event,
    request: bytes,
    seconds: float,
    out: Connection,
) -> None:
    os.sched_setaffinity(0, {core})
    client: Client | None = None
    try:
        client = transport.client()
        if not ready.wait(SETUP_TIMEOUT_S):
            raise TimeoutError("the server did not open its end")
        result = measure(client, request, seconds)
        client.stop()
        served.wait(STOP_TIMEOUT_S)  # the server reads the stop before this end goes
        out.send(result)
    except Exception as error:  # reported in the table, not raised in a child
        out.send(Failed(f"client: {error!r}"))
    finally:
        if client is not None:
            client.close()


def _receive(results: Connection, timeout_s: float) -> Any:
    return results.recv() if results.poll(timeout_s) else Failed("no result in time")


def run(
    transport: Transport, layout: Layout, request: bytes, seconds: float, cores: tuple[int, int]
) -> Row:
    """Measure one transport: a server process and a client process, each on its core."""
    context = mp.get_context("fork")  # the ends inherit what ``prepare`` made
    transport.prepare(layout)
    try:
        ready, served = context.Event(), context.Event()
        server_results, server_out = context.Pipe(duplex=False)
        client_results, client_out = context.Pipe(duplex=False)
        processes = [
            context.Process(
                target=_serve_main, args=(transport, cores[0], ready, served, server_out)
            ),
            context.Process(
                target=_call_main,
                args=(transport, cores[1], ready, served, request, seconds, client_out),
            ),
        ]
        for process in processes:
            process.start()
        client = _receive(client_results, SETUP_TIMEOUT_S + seconds + STOP_TIMEOUT_S)
        server = _receive(server_results, STOP_TIMEOUT_S)
        for process in processes:
            process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join()
        return Row(transport, client, server)
    finally:
        transport.cleanup()


# --- reporting -------------------------------------------------------------------------

HEADER = (
    "| transport | round trips/s | p50 µs | p99 µs | client CPU µs/round trip "
    "| server CPU µs/round trip | notes |\n"
    "|---|--:|--:|--:|--:|--:|---|"
)


def _cells(row: Row) -> list[str]:
    client, server = row.client, row.server
    if isinstance(client, Failed) or isinstance(server, Failed):
        failed = client if isinstance(client, Failed) else server
        assert isinstance(failed, Failed)
        return [row.transport.name, "-", "-", "-", "-", "-", f"failed: {failed.error}"]
    return [
        row.transport.name,
        f"{client.calls / client.wall_s:,.0f}",
        f"{client.p50_us:.1f}",
        f"{client.p99_us:.1f}",
        f"{client.cpu_s / client.calls * 1e6:.1f}",
        f"{server.cpu_s / server.calls * 1e6:.1f}",
        row.transport.notes,
    ]


def table(rows: Sequence[Row]) -> str:
    lines = [HEADER, *("| " + " | ".join(_cells(row)) + " |" for row in rows)]
    return "\n".join(lines)


def _measured(rows: Sequence[Row]) -> list[tuple[Row, ClientResult, ServerResult]]:
    return [
        (row, row.client, row.server)
        for row in rows
        if isinstance(row.client, ClientResult) and isinstance(row.server, ServerResult)
    ]


def conclusion(rows: Sequence[Row]) -> str:
    """Which blocking transport has the lowest floor, and the lane's floor against its cost."""
    blocking = [m for m in _measured(rows) if not m[0].transport.spinning]
    if not blocking:
        return "Nothing was measured."
    best, best_client, best_server = min(blocking, key=lambda m: m[1].p50_us)
    lines = [
        f"Lowest blocking floor: {best.transport.name}, p50 {best_client.p50_us:.1f} µs, "
        f"{best_server.cpu_s / best_server.calls * 1e6:.1f} µs of server CPU a round trip."
    ]
    for row, client, server in _measured(rows):
        if isinstance(row.transport, LaneTransport):
            server_us = server.cpu_s / server.calls * 1e6
            lines.append(
                f"{row.transport.name}: p50 {client.p50_us:.1f} µs, server CPU "
                f"{server_us:.1f} µs a round trip, {server_us / LANE_SERVER_US:.0%} of the "
                f"~{LANE_SERVER_US} µs the lane's server spends on a call today."
            )
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ipc", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per transport")
    parser.add_argument("--payload", type=int, default=16, help="request and answer bytes")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.payload < 1:
        parser.error("--seconds and --payload must be positive")
    return args


def _cores() -> tuple[int, int]:
    """The server's core and the client's: the first two this process may use."""
    available = sorted(os.sched_getaffinity(0))
    return available[0], available[min(1, len(available) - 1)]


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    layout = Layout(args.payload)
    request = bytes(i % 251 for i in range(args.payload))
    cores = _cores()
    print(
        f"server on core {cores[0]}, client on core {cores[1]}; {args.seconds:g} s a transport "
        f"after {WARMUP_CALLS:,} warm-up calls; {args.payload}-byte request and answer\n"
    )
    rows: list[Row] = []
    for kind in TRANSPORTS:
        transport = kind()
        if transport.library and importlib.util.find_spec(transport.library) is None:
            print(f"skipped {transport.name}: {transport.library} is not installed")
            continue
        rows.append(run(transport, layout, request, args.seconds, cores))
    print(table([row for row in rows if not row.transport.spinning]))
    print("\nFor reference, spinning (the client's core is busy the whole time):\n")
    print(table([row for row in rows if row.transport.spinning]))
    print("\n" + conclusion(rows))


if __name__ == "__main__":
    main()
