"""The local lane's wire format, the one thing its server and its client share.

A lane is one Unix-socket connection and one shared-memory slot, private to the two
processes at its ends:

1. **Hello** (client to server): one frame, a little-endian ``u32`` length and that many
   bytes of JSON: ``{"model": name or null, "version": number or null, "rows": the most
   rows a call will carry, "outputs": ["actions", ...], "sequences": false}`` (true: the
   server holds a recurrent policy's memory; :data:`SEQUENCE_FIELDS`).
2. **Welcome** (server to client): one frame of JSON, ``{"layout": ...}``
   (:class:`Layout`), with the slot's file descriptor passed beside it (``SCM_RIGHTS``): an
   anonymous ``memfd``, so nothing is ever named in ``/dev/shm`` and the memory goes when
   both ends have closed it, however they ended. Or ``{"error": {"code", "message"}}``, and
   the server closes the connection.
3. **Calls**, one at a time: the client writes its rows at the inputs' offsets and the
   request header (:data:`REQUEST`, its seq last: :data:`SEQ`), then sends one byte (the
   doorbell) unless the server says it is awake (:data:`SERVER_AWAKE_OFFSET`). The server reads
   the rows (copies them out first), runs them through the same steps as an HTTP or gRPC
   call, writes the outputs and the answer header (:data:`ANSWER`, with the version that
   computed them, or an error message at ``message_offset``), and sends one byte back
   unless the client says it is awake (:data:`CLIENT_AWAKE_OFFSET`).

Every offset and size the server reads is its own (the layout it made); what the client
writes there is only data, checked like any request's.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import IntEnum, IntFlag
from typing import Any

import orjson

DOORBELL = b"\x01"
MAX_FRAME_BYTES = 64 * 1024  # a hello or a welcome is far smaller
FRAME = struct.Struct("<I")

# The request header at offset 0: seq, rows, flags, seed, timeout in ms (0: the default).
REQUEST = struct.Struct("<QIIqd")
REQUEST_OFFSET = 0
# The answer header: seq, status, message bytes, version, sha256 (hex), Retry-After in s
# (0: none), HTTP status of an error (0: none).
ANSWER = struct.Struct("<QIIQ64sdI")
ANSWER_OFFSET = 64
# A header's seq is written last, after its other fields (``*_REST``, right after the seq)
# and after the rows or outputs: a reader that finds the seq it waits for finds the rest
# written (stores become visible in order on x86-64). Each end may so wait for the other by
# reading the seq, spinning, before it sleeps on the doorbell.
SEQ = struct.Struct("<Q")
REQUEST_REST = struct.Struct("<IIqd")
ANSWER_REST = struct.Struct("<IIQ64sdI")
# Awake words (u32, between the request and the answer headers; 0 in a new slot): an end
# holds its word at 1 while it is awake and looks for the other's seq, and the other end
# then leaves the doorbell unrung: a call answered within the spins costs neither end a
# system call. An end sets its word to 0 before it sleeps and then reads the seq once
# more; each end puts a full fence (:func:`fence`) between writing its seq or word and
# reading the other's, so at least one of the two sees the other's write: a call or an
# answer is never left without a ring or a look. An end that knows nothing of the words
# leaves its own at 0, and the other rings every time, as before.
SERVER_AWAKE_OFFSET = 32
CLIENT_AWAKE_OFFSET = 36
AWAKE = struct.Struct("<I")
MESSAGE_OFFSET = 256
MESSAGE_BYTES = 8192  # an error's JSON {"code", "message"}: messages are capped far below
DATA_OFFSET = MESSAGE_OFFSET + MESSAGE_BYTES
ALIGN = 64


_FENCE = threading.Lock()


def fence() -> None:
    """A full memory barrier between an end's write and its next read of the slot: an
    uncontended lock taken and let go (a locked instruction on x86-64). Where a lock is
    weaker, the server's doorbell wait still ends within ``AWAKE_CHECK_S``."""
    _FENCE.acquire()
    _FENCE.release()


# The serving thread sleeps on its doorbells at most this long before it reads every
# lane's seq again: what a call left unrung could wait on a machine whose lock is no fence.
AWAKE_CHECK_S = 1.0


# Outputs a hello may ask for: these by name, and "distribution" for all of the
# distribution's parameters (logits, or mean and log_std), as the predict routes say it.
OWN_OUTPUTS = ("actions", "log_probs", "values", "q_values", "state")
STATE = "state"  # a recurrent policy's next state: every answer of one carries it
# A lane whose hello says "sequences": the server holds a recurrent policy's memory: each
# row names its sequence (an integer id) and whether it starts or ends there, in these
# areas (int64, uint8, uint8 per row); no state travels either way.
SEQUENCE_FIELDS = ("sequence_id", "sequence_start", "sequence_end")
CLIENT_HELD = ("state", "episode_start")  # a recurrent policy's inputs the client carries
DISTRIBUTION = "distribution"


class Flags(IntFlag):
    DETERMINISTIC = 1
    SEEDED = 2


class Status(IntEnum):
    OK = 0
    ERROR = 1  # the message area holds {"code", "message"}
    RECONNECT = 2  # the model's tensors changed (a new version): say hello again


@dataclass(frozen=True, slots=True)
class Hello:
    model: str | None
    version: int | None
    rows: int
    outputs: tuple[str, ...]
    sequences: bool = False  # the server holds the sequences' memory (SEQUENCE_FIELDS)


@dataclass(frozen=True, slots=True)
class Area:
    """Where one tensor's rows sit in the slot."""

    name: str  # the tensor's name in the Open Inference Protocol's terms
    key: str | None  # the observation's key in a Dict space
    dtype: str  # numpy's spelling, e.g. "<f4"
    shape: tuple[int, ...]  # one row's shape
    offset: int
    row_bytes: int
    field: str | None = None  # an input beside the observations: the predict field it is
    # ("action_masks", "state", "episode_start", or one of SEQUENCE_FIELDS); None: an
    # observation (or an output)


@dataclass(frozen=True, slots=True)
class Layout:
    model: str
    rows: int  # the most rows a call may carry
    size: int  # the slot's bytes
    inputs: tuple[Area, ...]
    outputs: tuple[Area, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, given: dict[str, Any]) -> Layout:
        def areas(key: str) -> tuple[Area, ...]:
            return tuple(
                Area(
                    a["name"],
                    a["key"],
                    a["dtype"],
                    tuple(a["shape"]),
                    a["offset"],
                    a["row_bytes"],
                    a.get("field"),
                )
                for a in given[key]
            )

        return cls(given["model"], given["rows"], given["size"], areas("inputs"), areas("outputs"))


Placed = tuple[str, str | None, str, tuple[int, ...], int, str | None]


def place(tensors: Sequence[Placed], rows: int, start: int) -> tuple[list[Area], int]:
    """Areas for ``(name, key, dtype, row shape, itemsize, field)`` one after another from
    ``start``, each aligned; and where the next would start."""
    areas, offset = [], start
    for name, key, dtype, shape, itemsize, field in tensors:
        count = 1
        for dim in shape:
            count *= dim
        row_bytes = count * itemsize
        offset = -(-offset // ALIGN) * ALIGN
        areas.append(Area(name, key, dtype, shape, offset, row_bytes, field))
        offset += rows * row_bytes
    return areas, offset


def frame(message: dict[str, Any]) -> bytes:
    data = orjson.dumps(message)
    return FRAME.pack(len(data)) + data


def frame_length(head: bytes) -> int:
    """The JSON bytes a frame's head announces; ValueError past MAX_FRAME_BYTES."""
    (length,) = FRAME.unpack(head)
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"a lane frame of {length} bytes; at most {MAX_FRAME_BYTES}")
    return length
