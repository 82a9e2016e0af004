"""The local lane's serving thread (``lane_serving: thread``): every lane with a call rung
is served together, as one batch, without a step of asyncio per call.

The thread finds the lanes with a call pending by their slots' request seq
(``kernel.lane_wire``): after each batch it reads them in a spin for ``lane_spin_us``, then
sleeps on the doorbells of every lane handed to it (one ``select`` over their sockets) until
one rings. While it is awake each slot's server word says so, and clients do not ring; it
rings a client only when the client's word says it sleeps (``lane_wire``'s awake words).
The lanes that rang together are grouped by the model and version they name; each group
is one batch: each call's rows are read from its slot and checked as the loop's path checks
them (the same deadline rule and admission, the version's validation, the
same RECONNECT when the served version's tensors moved), then one run of the model, and
each call's outputs written back into its slot before its doorbell is answered. A call
that fails is answered with its error alone; the others of its batch are not touched.

What the loop's path gives every call, this one gives every batch: one record, made and
published to the model's record sinks (the metrics, the experience stream) on the event
loop once the batch's answers are written, and refusals counted there too. They are handed
over in an outbox that the event loop empties every ``OUTBOX_S`` (a wake-up of the loop per
call would cost as much as the call's own steps): a record reaches its sinks at most that
much later than on the loop's path.

Lanes of server-held sequences are not handed here: their memory lives in the model's
sequence table, on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kernel import lane_wire as wire
from kernel.errors import RLServeError, internal_error
from serve.batching.batch_run import batch_record, failure, publish, stacked
from serve.dataplane.messages import Prepared
from serve.dataplane.model import RowModel
from serve.dataplane.routing import Route
from serve.frontends.lane.slot import (
    Lane,
    call_id,
    check_rows,
    inputs_of,
    parameters_of,
    version_text,
    write_answer,
    write_error,
    write_outputs,
)
from serve.frontends.oip.infer import Inference
from serve.frontends.oip.signature import InferCall, Signature

log = logging.getLogger("rlserve.lane")

_READ = 64  # doorbell bytes read at once: a client rings once per call
OUTBOX_S = 0.01  # how often the event loop takes the thread's records and refusals


@dataclass
class _Open:
    """A lane the thread serves: its connection and its slot."""

    lane: Lane
    conn: socket.socket
    received_at: float = 0.0
    served: int = 0  # the seq of the last call served: a call is pending when it differs

    def pending(self) -> bool:
        return wire.SEQ.unpack_from(self.lane.slot, wire.REQUEST_OFFSET)[0] != self.served


@dataclass
class _Taken:
    """One call of a batch, read and checked."""

    entry: _Open
    seq: int
    call: InferCall
    prepared: Prepared


class LaneEngine:
    """The serving thread of the lanes handed to it (``add``), until ``stop``."""

    def __init__(
        self, inference: Inference, loop: asyncio.AbstractEventLoop, *, spin_us: float = 0.0
    ) -> None:
        self.inference = inference
        self.spin_s = spin_us / 1e6  # how long the thread reads the slots before it sleeps
        self._loop = loop
        self._selector = selectors.DefaultSelector()
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._selector.register(self._wake_in, selectors.EVENT_READ, None)
        self._new: list[_Open] = []
        self._lock = threading.Lock()  # guards _new, handed over from the event loop
        self._open: dict[int, _Open] = {}  # by socket fd
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="rlserve-lane-thread", daemon=True)
        self._outbox: collections.deque[Callable[[], None]] = collections.deque()
        self._emptying: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ life (event loop)

    def start(self) -> None:
        self._thread.start()
        self._emptying = self._loop.create_task(self._empty_outbox(), name="rlserve-lane-outbox")

    async def _empty_outbox(self) -> None:
        while True:
            await asyncio.sleep(OUTBOX_S)
            self._deliver()

    def _deliver(self) -> None:
        """Run what the thread left for the event loop (make and publish records, count
        refusals); one that fails (a bug of ours) is logged, and the rest still run."""
        while self._outbox:
            work = self._outbox.popleft()
            try:
                work()
            except Exception:
                log.exception("a local-lane batch's record or count failed")

    @property
    def lanes(self) -> int:
        """Lanes served by the thread now (for the connection limit)."""
        return len(self._open) + len(self._new)

    def add(self, lane: Lane, conn: socket.socket) -> None:
        """Serve ``lane`` from now on; the engine closes ``conn`` when its client does."""
        with self._lock:
            self._new.append(_Open(lane, conn))
        self._wake_out.send(b"\x00")

    async def stop(self, grace_s: float) -> None:
        """Serve no more calls once the one running is answered (within ``grace_s``), then
        close every lane: each client sees its socket end."""
        self._stopping = True
        self._wake_out.send(b"\x00")
        await asyncio.to_thread(self._thread.join, grace_s)
        if self._emptying is not None:
            self._emptying.cancel()
        self._deliver()
        for entry in [*self._open.values(), *self._new]:
            _close(entry)
        self._open.clear()
        self._wake_in.close()
        self._wake_out.close()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stopping:
            ready = self._wait()
            if ready and not self._stopping:
                self._serve(ready)

    def _wait(self) -> list[_Open]:
        """The lanes with a call pending: found in a spin over their slots' seq, for up to
        ``spin_s`` (no sleep, no wake-up), else once a doorbell (or a new lane, or stop)
        wakes the thread."""
        ready = self._spin()
        if ready:
            return ready
        self._say_awake(0)  # asleep: ring me (then one more look, past the fence)
        wire.fence()
        ready = self._pending()
        if not ready:
            for key, _ in self._selector.select(wire.AWAKE_CHECK_S):
                if key.data is None:
                    self._take_new()
                else:
                    self._drain(key.data)
            ready = self._pending()
        self._say_awake(1)
        return ready

    def _say_awake(self, awake: int) -> None:
        """Tell every lane's client whether the thread is awake (it then need not ring)."""
        for entry in self._open.values():
            wire.AWAKE.pack_into(entry.lane.slot, wire.SERVER_AWAKE_OFFSET, awake)

    def _spin(self) -> list[_Open]:
        if not self.spin_s or not self._open:
            return []
        until = time.perf_counter() + self.spin_s
        while True:
            ready = self._pending()
            if ready or time.perf_counter() >= until or self._stopping:
                return ready
            os.sched_yield()  # the event loop (and the core's other work) may run meanwhile

    def _pending(self) -> list[_Open]:
        now = time.monotonic()
        ready = [entry for entry in self._open.values() if entry.pending()]
        for entry in ready:
            entry.received_at = now
        return ready

    def _take_new(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_in.recv(_READ)
        with self._lock:
            new, self._new = self._new, []
        for entry in new:
            entry.conn.setblocking(False)
            self._open[entry.conn.fileno()] = entry
            self._selector.register(entry.conn, selectors.EVENT_READ, entry)

    def _drain(self, entry: _Open) -> None:
        """Read a lane's doorbell bytes (they only wake the thread: the seq says which
        calls are pending); a lane whose client closed it is dropped."""
        try:
            rung = entry.conn.recv(_READ)
        except BlockingIOError:
            return
        except OSError:
            rung = b""
        if not rung:
            self._drop(entry)

    def _drop(self, entry: _Open) -> None:
        self._selector.unregister(entry.conn)
        self._open.pop(entry.conn.fileno(), None)
        _close(entry)

    def _serve(self, ready: list[_Open]) -> None:
        groups: dict[tuple[str, int | None], list[_Open]] = {}
        for entry in ready:
            groups.setdefault((entry.lane.model, entry.lane.version), []).append(entry)
        for (model, version), entries in groups.items():
            try:
                routed = self._routes(model, version, entries)
            except RLServeError as exc:
                routed = []
                for entry in entries:
                    self._refuse(None, entry, exc)
            try:
                for route, sided in routed:
                    self._batch(route, sided)
            except Exception as exc:  # a bug of ours: every call of the group learns of it
                log.exception("unhandled error on local-lane calls for %r", model)
                for entry in entries:
                    self._refuse(None, entry, internal_error(exc))
            for entry in entries:
                self._answered(entry)

    def _routes(
        self, model: str, version: int | None, entries: list[_Open]
    ) -> list[tuple[Route, list[_Open]]]:
        """The lanes' calls by the version that serves them: one route for all, unless the
        model has a canary, which serves each lane (one actor) on the side its key draws."""
        first = entries[0]
        route = self.inference.route(model, version_text(version), first.lane.episode_key)
        if not route.by_episode:
            return [(route, entries)]
        sides: dict[int | None, tuple[Route, list[_Open]]] = {route.pinned: (route, [first])}
        for entry in entries[1:]:
            side = self.inference.route(model, None, entry.lane.episode_key)
            sides.setdefault(side.pinned, (side, []))[1].append(entry)
        return list(sides.values())

    def _answered(self, entry: _Open) -> None:
        """Ring the lane's client, unless it said it is awake, looking for the answer."""
        wire.fence()
        if wire.AWAKE.unpack_from(entry.lane.slot, wire.CLIENT_AWAKE_OFFSET)[0]:
            return
        try:
            entry.conn.send(wire.DOORBELL)
        except OSError as exc:
            log.debug("local lane closed: %s", exc)
            self._drop(entry)

    # ------------------------------------------------------------------ one batch

    def _batch(self, route: Route, entries: list[_Open]) -> None:
        served = route.row_model()
        signature = self.inference.signature(served)
        taken = [t for t in (self._take(route, served, signature, e) for e in entries) if t]
        limit = route.row_scheduler().max_batch_size
        while taken:
            rows, end = 0, 0
            while end < len(taken) and (end == 0 or rows + taken[end].prepared.rows <= limit):
                rows += taken[end].prepared.rows
                end += 1
            self._run_batch(route, served, signature, taken[:end])
            taken = taken[end:]

    def _take(
        self, route: Route, served: RowModel, signature: Signature, entry: _Open
    ) -> _Taken | None:
        """One lane's call read from its slot and checked (None: it was answered already)."""
        lane, slot, received_at = entry.lane, entry.lane.slot, entry.received_at
        seq, rows, flags, seed, timeout_ms = wire.REQUEST.unpack_from(slot, wire.REQUEST_OFFSET)
        entry.served = seq
        try:
            check_rows(lane.layout, rows)
            if not lane.follows(served.sha256, signature):
                write_answer(slot, seq, wire.Status.RECONNECT)
                return None
            call = InferCall(
                inputs_of(slot, lane.layout, rows), parameters_of(flags, seed), lane.outputs
            )
            asked_ms = timeout_ms if timeout_ms > 0 else None
            deadline = self.inference.admitted(route, call, received_at, asked_ms)
            # the slot's tensors were laid out from this signature (``lane.follows``)
            request = signature.laid_out_request(call, call_id(lane, seq), received_at, deadline.at)
            return _Taken(entry, seq, call, served.prepare(request))
        except RLServeError as exc:
            self._refuse(route, entry, exc, seq)
            return None

    def _run_batch(
        self, route: Route, served: RowModel, signature: Signature, taken: list[_Taken]
    ) -> None:
        prepared = [t.prepared for t in taken]
        inputs = stacked(prepared)
        started = time.monotonic()
        try:
            outputs = served.execute(inputs, prepared)
        except Exception as exc:
            error = failure(served, exc)
            for one in taken:
                self._refuse(route, one.entry, error, one.seq)
            return
        span = (started, time.monotonic())
        start = 0
        for one in taken:
            self._write(served, signature, one, outputs, start)
            start += one.prepared.rows
        scheduler = route.row_scheduler()
        sinks, max_rows = scheduler.sinks, scheduler.max_batch_size
        queued_at = [p.received_at for p in prepared]  # no queue: taken as they rang

        def record() -> None:  # on the event loop, off the answers' way
            publish(
                batch_record(served, prepared, queued_at, inputs, outputs, span, max_rows), sinks
            )

        self._outbox.append(record)

    def _write(
        self,
        served: RowModel,
        signature: Signature,
        one: _Taken,
        outputs: dict[str, np.ndarray],
        start: int,
    ) -> None:
        lane = one.entry.lane
        tensors = signature.answer(one.call, served.respond(one.prepared, outputs, start))
        write_outputs(lane.slot, lane.layout, tensors, one.prepared.rows)
        write_answer(lane.slot, one.seq, wire.Status.OK, served.version, served.sha256)

    def _refuse(
        self, route: Route | None, entry: _Open, error: RLServeError, seq: int | None = None
    ) -> None:
        slot = entry.lane.slot
        if seq is None:
            seq = wire.REQUEST.unpack_from(slot, wire.REQUEST_OFFSET)[0]
        write_error(slot, seq, error)
        received_at = entry.received_at
        self._outbox.append(lambda: self.inference.refused(route, error, received_at))


def _close(entry: _Open) -> None:
    entry.conn.close()
    entry.lane.close()
