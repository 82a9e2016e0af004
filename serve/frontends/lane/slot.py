"""A local lane's slot: its layout made from the model's contract, the sealed memfd that
holds it, and the reading and writing of one call in it (``kernel.lane_wire`` has the
format), for the loop's path (``server``) and the serving thread (``engine``) alike."""

from __future__ import annotations

import fcntl
import mmap
import os
from collections.abc import Sequence

import numpy as np
import orjson

from kernel import lane_wire as wire
from kernel.errors import InvalidInput, RLServeError, listed
from serve.dataplane.routing import Route
from serve.frontends.oip.signature import OutputTensor, RequestedOutput, Signature
from serve.frontends.oip.tensors import DTYPES
from serve.status import http_headers, http_status


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
        self.id_prefix = f"lane-{id(self):x}-"  # its calls' request ids: call_id
        # while the model has a canary, every call of the lane is served on one side: a
        # lane is one actor's connection, and its episodes stay whole
        self.episode_key = self.id_prefix

    def follows(self, served_sha256: str, signature: Signature) -> bool:
        """Whether the lane may take the served version: its own, or another whose tensors
        fit the layout (then the lane follows it); else the client must open a new lane."""
        if served_sha256 == self.sha256:
            return True
        if layout_of(self.model, signature, hello_of(self.layout)) != self.layout:
            return False
        self.sha256 = served_sha256
        return True

    def close(self) -> None:
        """The slot's mapping and descriptor (the connection is its server's to close)."""
        self.slot.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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


def hello_of(layout: wire.Layout) -> wire.Hello:
    """A hello that makes this layout again, if the model's tensors are the same."""
    outputs = tuple(a.name for a in layout.outputs)
    sequences = any(a.field in wire.SEQUENCE_FIELDS for a in layout.inputs)
    return wire.Hello(layout.model, None, layout.rows, outputs, sequences=sequences)


def call_id(lane: Lane, seq: int) -> str:
    """A lane call's request id, as records and logs show it."""
    return lane.id_prefix + str(seq)


def check_rows(layout: wire.Layout, rows: int) -> None:
    """A call carries 1 to the lane's rows (InvalidInput else)."""
    if not 1 <= rows <= layout.rows:
        raise InvalidInput(f"rows: this lane carries 1 to {layout.rows} rows a call, got {rows}")


def write_outputs(
    slot: mmap.mmap, layout: wire.Layout, tensors: Sequence[OutputTensor], rows: int
) -> None:
    """A call's output tensors into their areas, ``rows`` rows each."""
    for area, tensor in zip(layout.outputs, tensors, strict=True):
        data = np.ascontiguousarray(tensor.values, dtype=area.dtype)
        if data.nbytes != rows * area.row_bytes:
            raise RuntimeError(f"output {area.name}: {data.nbytes} bytes for {rows} rows")
        slot[area.offset : area.offset + data.nbytes] = data.tobytes()


def inputs_of(slot: mmap.mmap, layout: wire.Layout, rows: int) -> dict[str, np.ndarray]:
    """Each input's rows, copied out of the slot (the client may write it again at once)."""
    inputs = {}
    for area in layout.inputs:
        if area.field in wire.SEQUENCE_FIELDS:
            continue  # parameters: sequences_of
        count = rows * area.row_bytes // np.dtype(area.dtype).itemsize
        view = np.frombuffer(slot, area.dtype, count, area.offset)
        inputs[area.name] = view.reshape(rows, *area.shape).copy()
    return inputs


def sequences_of(slot: mmap.mmap, layout: wire.Layout, rows: int) -> dict[str, object]:
    """The rows' sequence ids, starts and ends, as the predict parameters of server-held
    sequences (none on a lane without them)."""
    parameters: dict[str, object] = {}
    for area in layout.inputs:
        if area.field not in wire.SEQUENCE_FIELDS:
            continue
        values = np.frombuffer(slot, area.dtype, rows, area.offset).copy()
        parameters[area.field] = values.tolist() if area.dtype == "<i8" else values != 0
    return parameters


_DETERMINISTIC, _SEEDED = int(wire.Flags.DETERMINISTIC), int(wire.Flags.SEEDED)


def parameters_of(flags: int, seed: int) -> dict[str, object]:
    """A call's predict parameters from its header's flags (plain integer tests: an
    ``IntFlag`` made per call cost more than the rest of this)."""
    parameters: dict[str, object] = {"deterministic": bool(flags & _DETERMINISTIC)}
    if flags & _SEEDED:
        parameters["seed"] = seed
    return parameters


def write_answer(
    slot: mmap.mmap, seq: int, status: wire.Status, version: int = 0, sha256: str = "",
    message: int = 0, retry_after_s: float = 0.0, http: int = 0,
) -> None:  # fmt: skip
    rest = (status, message, version, sha256.encode(), retry_after_s, http)
    wire.ANSWER_REST.pack_into(slot, wire.ANSWER_OFFSET + wire.SEQ.size, *rest)
    wire.SEQ.pack_into(slot, wire.ANSWER_OFFSET, seq)  # last: the answer is whole


def write_error(slot: mmap.mmap, seq: int, error: RLServeError) -> None:
    body = orjson.dumps({"code": error.code.value, "message": error.message})[: wire.MESSAGE_BYTES]
    slot[wire.MESSAGE_OFFSET : wire.MESSAGE_OFFSET + len(body)] = body
    retry = http_headers(error).get("Retry-After")
    write_answer(
        slot, seq, wire.Status.ERROR, message=len(body),
        retry_after_s=float(retry) if retry else 0.0, http=http_status(error),
    )  # fmt: skip


def version_text(version: int | None) -> str | None:
    return None if version is None else str(version)


# ---------------------------------------------------------------------- the socket
