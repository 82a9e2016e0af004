"""The local lane's client: predictions from a server on this host, with no HTTP.

    from client.lane import LaneClient
    with LaneClient("/run/rlserve/lane.sock") as lane:
        step = lane.predict(obs, model="cartpole", outputs=("actions", "log_probs"))

Rows are written straight into a shared-memory slot the server sized for the model
(``kernel.lane_wire``) and one byte on a Unix socket rings the server; the answer
comes back the same way, stamped with the version that computed it. Usually reached
through ``PolicyClient(url, lane=path)``, which keeps HTTP for the rest. Each thread gets
lanes of its own, one per (model, version, outputs); a lane whose server restarted, or
whose model's tensors changed with a new version, is opened again once, transparently.
A failed call raises ``client.policy.RequestFailed`` as over HTTP.
"""

from __future__ import annotations

import array
import contextlib
import mmap
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from client.prediction import Prediction, RequestFailed
from kernel import lane_wire as wire

# How long a call reads its answer's seq in the slot before it sleeps on the server's
# doorbell: an answer within it costs the client no wake-up (it spins on its own core).
SPIN_US = 100.0
_DOORBELLS = 64  # the server's doorbell bytes read at once, and left unread at most
_DETERMINISTIC, _SEEDED = int(wire.Flags.DETERMINISTIC), int(wire.Flags.SEEDED)
_STATUSES = tuple(sorted(wire.Status))  # by value: an answer's status without Status()


class LaneUnavailable(ConnectionError):
    """No server answers at the lane's path (none started, or it stopped)."""


class _Lane:
    """One open lane: its socket, its slot and its layout."""

    def __init__(self, path: Path, hello: wire.Hello, timeout_s: float, spin_s: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self.sock.close()
            raise LaneUnavailable(f"no rlserve local lane at {path}: {exc.strerror}") from exc
        try:
            self.layout, self.slot = _handshake(self.sock, hello)
        except BaseException:
            self.sock.close()
            raise
        self.seq = 0
        self.spin_s = spin_s  # how long a call reads the answer's seq before it sleeps
        self._unread = 0  # answers found in a spin since the doorbells were last drained
        self.inputs = {a.key: a for a in self.layout.inputs if a.field is None}
        self.extras = {
            a.field: a
            for a in self.layout.inputs
            if a.field is not None and a.field not in wire.SEQUENCE_FIELDS
        }
        self.sequences = {a.field: a for a in self.layout.inputs if a.field in wire.SEQUENCE_FIELDS}
        self.dtypes = {
            a.name: np.dtype(a.dtype) for a in (*self.layout.inputs, *self.layout.outputs)
        }

    def call(
        self, rows: dict[str | None, np.ndarray], extras: dict[str, np.ndarray], n: int,
        deterministic: bool, seed: int | None, timeout_ms: float | None,
    ) -> tuple[wire.Status, tuple[Any, ...]]:  # fmt: skip
        slot = self.slot
        for key, area in self.inputs.items():
            shown = f"observations{'' if key is None else f'[{key!r}]'}"
            self._write(area, rows[key], shown)
        for field, area in (*self.extras.items(), *self.sequences.items()):
            self._write(area, extras[field], field)
        self.seq += 1
        # plain integers: an IntFlag made per call costs more than packing the header
        flags = (_DETERMINISTIC if deterministic else 0) | (0 if seed is None else _SEEDED)
        rest = (n, flags, seed or 0, timeout_ms or 0.0)
        wire.REQUEST_REST.pack_into(slot, wire.REQUEST_OFFSET + wire.SEQ.size, *rest)
        if self.spin_s:  # awake until the spin ends: the server need not ring
            wire.AWAKE.pack_into(slot, wire.CLIENT_AWAKE_OFFSET, 1)
        wire.SEQ.pack_into(slot, wire.REQUEST_OFFSET, self.seq)  # last: the call is whole
        wire.fence()
        if not wire.AWAKE.unpack_from(slot, wire.SERVER_AWAKE_OFFSET)[0]:
            self.sock.sendall(wire.DOORBELL)  # the server sleeps: ring
        self._wait_answer()
        answer = wire.ANSWER.unpack_from(slot, wire.ANSWER_OFFSET)
        return _STATUSES[answer[1]], answer

    def _wait_answer(self) -> None:
        """Until the answer's seq is this call's: read in a spin for ``spin_s``, then on
        the server's doorbell bytes (a byte left by an answer found in a spin wakes a later
        wait early; the seq decides)."""
        slot, seq = self.slot, self.seq
        if self.spin_s and not self._spun(slot, seq):
            wire.AWAKE.pack_into(slot, wire.CLIENT_AWAKE_OFFSET, 0)  # asleep: ring me
            wire.fence()
        while wire.SEQ.unpack_from(slot, wire.ANSWER_OFFSET)[0] != seq:
            if not self.sock.recv(_DOORBELLS):
                raise ConnectionResetError("the server closed the local lane")
        self._unread += 1
        if self._unread >= _DOORBELLS:  # doorbells of answers found in a spin: drop them
            self._unread = 0
            # A socket with a timeout is non-blocking underneath (Python's socket docs):
            # read(2) takes what is there and never waits, as recv would for the timeout.
            with contextlib.suppress(BlockingIOError):
                os.read(self.sock.fileno(), 4 * _DOORBELLS)

    def _spun(self, slot: mmap.mmap, seq: int) -> bool:
        """Whether the answer came within the spin."""
        spin_until = time.perf_counter() + self.spin_s
        while wire.SEQ.unpack_from(slot, wire.ANSWER_OFFSET)[0] != seq:
            if time.perf_counter() >= spin_until:
                return False
            os.sched_yield()  # actors sharing a core: the others run while this one spins
        return True

    def _write(self, area: wire.Area, given: np.ndarray, shown: str) -> None:
        data = np.ascontiguousarray(given, self.dtypes[area.name])
        if data.shape[1:] != area.shape:
            raise ValueError(
                f"{shown}: rows of shape {list(area.shape)} expected, got {list(data.shape[1:])}"
            )
        self.slot[area.offset : area.offset + data.nbytes] = data.tobytes()

    def extra_rows(
        self, given: Mapping[str, Any], n: int, *, single: bool
    ) -> dict[str, np.ndarray]:
        """The inputs beside the observations this model takes (action masks, a recurrent
        policy's state and episode starts), as rows; a recurrent policy's state may be left
        out where every row starts an episode (zeros, as the server would take it)."""
        if not given and not self.extras:
            return {}  # the common case: observations alone
        unknown = sorted(set(given) - set(self.extras))
        if unknown:
            takes = sorted(map(str, self.extras)) or "nothing"
            raise ValueError(f"inputs: {unknown} are not taken by this model (it takes {takes})")
        rows = {}
        for field, area in self.extras.items():
            value = given.get(field)
            if value is None and field == "state" and _all_start(given.get("episode_start")):
                value = np.zeros((n, *area.shape), self.dtypes[area.name])
            elif value is None and field == "episode_start":
                value = np.zeros(n, bool)
            if value is None:
                raise ValueError(f"{field}: required by this model; give it with the observations")
            array = np.asarray(value)
            if field == "episode_start" and array.ndim == 0:
                array = np.full(n, bool(array))
            rows[field] = array[np.newaxis] if single and array.ndim == len(area.shape) else array
        return rows

    def sequence_rows(
        self, sequence_id: Any, start: Any, end: Any, n: int
    ) -> dict[str, np.ndarray]:
        """Each row's sequence: its integer id, and whether it starts or ends there (one
        boolean for every row, or one per row)."""
        ids = np.asarray(sequence_id)
        if ids.dtype.kind not in "iu" or ids.shape not in ((), (n,)):
            raise ValueError(
                f"sequence_id: the local lane takes integer ids, one for {n} row(s) or one per "
                "row; send string ids over HTTP"
            )
        if ids.ndim == 1 and len(set(ids.tolist())) != n:
            raise ValueError("sequence_id: ids repeat; each row steps its own sequence")
        rows = {"sequence_id": np.broadcast_to(ids, (n,)).astype(np.int64)}
        for field, value in (("sequence_start", start), ("sequence_end", end)):
            flags = np.asarray(value)
            if flags.dtype.kind in "iu" and np.isin(flags, (0, 1)).all():
                flags = flags.astype(bool)  # 0 and 1, as over HTTP
            if flags.dtype != np.bool_ or flags.shape not in ((), (n,)):
                raise ValueError(f"{field}: true, false, or one boolean per row ({n})")
            rows[field] = np.broadcast_to(flags, (n,)).astype(np.uint8)
        return rows

    def outputs(self, n: int) -> dict[str, np.ndarray]:
        return {
            area.name: np.frombuffer(
                self.slot,
                self.dtypes[area.name],
                n * area.row_bytes // self.dtypes[area.name].itemsize,
                area.offset,
            )
            .reshape(n, *area.shape)
            .copy()
            for area in self.layout.outputs
        }

    def error(self, answer: tuple[Any, ...]) -> RequestFailed:
        _, _, length, _, _, retry_after_s, status = answer
        body = orjson.loads(self.slot[wire.MESSAGE_OFFSET : wire.MESSAGE_OFFSET + length])
        return RequestFailed(status, body["code"], body["message"], retry_after_s or None)

    def close(self) -> None:
        self.sock.close()
        self.slot.close()


class LaneClient:
    """Thread-safe: each thread that uses it gets lanes of its own."""

    def __init__(
        self, path: str | Path, *, timeout_s: float = 10.0, spin_us: float = SPIN_US
    ) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.spin_s = spin_us / 1e6  # 0: sleep on the doorbell at once
        self._local = threading.local()
        self._opened: list[_Lane] = []
        self._lock = threading.Lock()

    def __enter__(self) -> LaneClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def available(self) -> bool:
        """Whether a server answers at the lane's path now."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.path))
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def predict(
        self,
        observations: Any,
        *,
        model: str | None = None,
        version: int | None = None,
        deterministic: bool = True,
        seed: int | None = None,
        outputs: Sequence[str] = ("actions",),
        timeout_ms: float | None = None,
        inputs: Mapping[str, Any] | None = None,
        sequence_id: Any = None,
        sequence_start: Any = False,
        sequence_end: Any = False,
    ) -> Prediction:
        """``inputs``: what the model takes beside its observations, by predict field:
        ``action_masks`` (MaskablePPO), ``state`` and ``episode_start`` (a recurrent
        policy; the answer's ``state`` is the next one). ``sequence_id`` (an integer, or one
        per row): the server holds a recurrent policy's memory instead, as over HTTP;
        ``sequence_start`` / ``sequence_end`` mark a sequence's first and last step."""
        keyed = observations if isinstance(observations, dict) else {None: observations}
        arrays = {k: np.asarray(v) for k, v in keyed.items()}
        names = tuple(dict.fromkeys(outputs))
        held = sequence_id is not None
        for attempt in (1, 2):
            lane = self._lane(model, version, names, arrays, held=held)
            single = _single(lane, arrays)
            rows = {k: v[None] if single else v for k, v in arrays.items()}
            n = len(next(iter(rows.values())))
            extras = lane.extra_rows(inputs or {}, n, single=single)
            if held:
                extras |= lane.sequence_rows(sequence_id, sequence_start, sequence_end, n)
            try:
                status, answer = lane.call(rows, extras, n, deterministic, seed, timeout_ms)
            except (ConnectionError, BrokenPipeError) as exc:
                self._drop(lane)  # the server restarted, or stopped: once more on a new lane
                if attempt == 2:
                    raise LaneUnavailable(f"the local lane at {self.path} closed: {exc}") from exc
                continue
            if status is wire.Status.RECONNECT:  # a version with other tensors: a new slot
                self._drop(lane)
                continue
            if status is wire.Status.ERROR:
                raise lane.error(answer)
            return _prediction(lane, answer, lane.outputs(n), single)
        raise LaneUnavailable(f"the local lane at {self.path} kept changing its layout")

    def _lane(
        self, model: str | None, version: int | None, outputs: tuple[str, ...],
        arrays: dict[str | None, np.ndarray], *, held: bool,
    ) -> _Lane:  # fmt: skip
        lanes: dict[tuple[Any, ...], _Lane] = self._local.__dict__.setdefault("lanes", {})
        key = (model, version, outputs, held)
        lane = lanes.get(key)
        rows = max((len(v) if v.ndim > 1 else 1) for v in arrays.values())
        if lane is not None and lane.layout.rows < rows:
            self._drop(lane)
            lane = None
        if lane is None:
            hello = wire.Hello(model, version, max(rows, 1), outputs, sequences=held)
            lane = lanes[key] = _Lane(self.path, hello, self.timeout_s, self.spin_s)
            with self._lock:
                self._opened.append(lane)
        return lane

    def _drop(self, lane: _Lane) -> None:
        lanes: dict[tuple[Any, ...], _Lane] = self._local.__dict__.get("lanes", {})
        for key, value in list(lanes.items()):
            if value is lane:
                del lanes[key]
        lane.close()
        with self._lock:
            if lane in self._opened:
                self._opened.remove(lane)

    def close(self) -> None:
        with self._lock:
            for lane in self._opened:
                lane.close()
            self._opened.clear()
        self._local = threading.local()


def _handshake(sock: socket.socket, hello: wire.Hello) -> tuple[wire.Layout, mmap.mmap]:
    given = {
        "model": hello.model,
        "version": hello.version,
        "rows": hello.rows,
        "outputs": list(hello.outputs),
        "sequences": hello.sequences,
    }
    # Refused before the server read the hello (its connection limit): its answer says why.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(wire.frame(given))
    fds = array.array("i")
    head, ancillary, _, _ = sock.recvmsg(wire.FRAME.size, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    try:
        if len(head) < wire.FRAME.size:
            raise ConnectionResetError("the server closed the local lane during its hello")
        body = _read_exactly(sock, wire.frame_length(head))
        welcome = orjson.loads(body)
        if "error" in welcome:
            error = welcome["error"]
            raise RequestFailed(error.get("status", 503), error["code"], error["message"], None)
        layout = wire.Layout.from_json(welcome["layout"])
        if not fds:
            raise ConnectionResetError("the server sent no slot with its welcome")
        return layout, mmap.mmap(fds[0], layout.size)
    finally:
        for fd in fds:
            os.close(fd)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            raise ConnectionResetError("the server closed the local lane during its hello")
        data += more
    return data


def _single(lane: _Lane, arrays: dict[str | None, np.ndarray]) -> bool:
    """Whether the call is one observation (answered without the batch axis)."""
    if arrays.keys() != lane.inputs.keys():
        given = "an array" if None in arrays else f"a dict with keys {sorted(map(str, arrays))}"
        raise ValueError(f"observations: this model takes {_described(lane)}; got {given}")
    key, values = next(iter(arrays.items()))
    return values.ndim == len(lane.inputs[key].shape)


def _described(lane: _Lane) -> str:
    keys = list(lane.inputs)
    return "one array" if keys == [None] else f"a dict with keys {keys}"


def _prediction(
    lane: _Lane, answer: tuple[Any, ...], values: dict[str, np.ndarray], single: bool
) -> Prediction:
    version, sha256 = answer[3], answer[4].decode()
    if single:
        values = {k: v[0] for k, v in values.items()}
    distribution = {k: v for k, v in values.items() if k not in wire.OWN_OUTPUTS}
    return Prediction(
        lane.layout.model, version, sha256,
        actions=values.get("actions"), log_probs=values.get("log_probs"),
        values=values.get("values"), distribution=distribution or None,
        q_values=values.get("q_values"), state=values.get(wire.STATE),
    )  # fmt: skip


def _all_start(value: Any) -> bool:
    return value is not None and bool(np.all(np.asarray(value)))
