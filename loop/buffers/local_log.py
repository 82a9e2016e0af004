"""``file:///DIR``: an append-only log on local disk, for producers and a trainer that are
separate processes on one machine. No server, no threads.

Layout of DIR::

    00000000000000000000.log   segments, named by the sequence number of their first record
    append.lock                producers append under an exclusive flock of this file
    groups/<group>.offset      a group's committed position: "SEQ SEGMENT BYTE_OFFSET"
    groups/<group>.lock        held (flock) by the group's one live consumer

Each record is one frame: a header ``<IQB`` (payload length, sequence number, flags), the
payload (an encoded :data:`~loop.experience.Record`, zstd-compressed when flag 1 is set) and
a CRC-32 of header and payload. Sequence numbers count records from 0 across segments.

Guarantees (``loop.buffers.base``):

- **Order**: records are appended in publish order under the lock; a group reads them in
  sequence, so an episode's steps arrive in order.
- **Torn writes**: a producer killed mid-write leaves a frame that fails its CRC or is
  short, at the tail. Readers stop before it; the next producer truncates it (under the
  lock) before appending. Nothing that was acknowledged is lost: ``publish`` returns after
  ``write``, so a record survives its producer being killed; it survives a power cut only
  after ``flush`` (fsync).
- **Damage in the middle**: a frame that fails its CRC with intact frames after it (a
  flipped bit on disk, an edit by hand) is not a torn write: readers skip it (logged,
  counted in ``undecodable``) and deliver what follows; producers keep it and never
  truncate the intact records after it. A frame whose payload does not decode (or
  decompresses beyond ``max_record_bytes``) is skipped the same way.
- **At least once**: a consumer starts at its group's committed position, so what it was
  delivered and did not commit comes again after a restart (or a kill -9). Commits are
  cumulative (offsets, as in Kafka): committing a delivery commits every delivery before it.
  The offset file is replaced atomically (write, fsync, rename).
- **One consumer per group** at a time (the group lock; released by the kernel when its
  holder dies). Several groups, and several producer processes, are fine. A producer may
  be shared by threads; a consumer belongs to one thread.
- **Bounded**: ``pending`` = next sequence number - the slowest group's committed one
  (everything published before any group exists); a publish that does not fit waits,
  polling every few ms, up to ``publish_timeout_s``, then ``overflow`` applies.
- **Space**: segments rotate at ``segment_bytes`` (``file:///DIR?segment_bytes=N``,
  default 64 MiB); a commit deletes segments that every group has read past.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import logging
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from kernel.errors import ConfigError
from loop.buffers.base import (
    BufferOptions,
    BufferUnavailable,
    ConsumerCounts,
    Delivery,
    ProducerCounts,
    RecordReader,
    overflow,
)
from loop.experience import Record, encode
from loop.group_names import check_group_name

log = logging.getLogger(__name__)

HEADER = struct.Struct("<IQB")  # payload length, sequence number, flags
SEQ, SEQ_AT = struct.Struct("<Q"), 4  # the sequence number in a header, and where it is
MAX_LOST = 64  # damaged records in a row that readers look past
CRC = struct.Struct("<I")
ZSTD = 1  # flag: the payload is zstd-compressed
SEGMENT_BYTES = 64 << 20
READ_BYTES = 1 << 20  # one read of a consumer
FULL_POLL_S = 0.005  # a full producer re-checks the groups' offsets this often
POLL_MAX_S = 0.001  # a waiting consumer looks for new records this often (p99 ~1 ms late)


class Position(NamedTuple):
    """Where a group resumes: the sequence number of the next record, and where it is."""

    seq: int
    segment: int  # the first sequence number of its segment (the segment's name)
    offset: int  # byte offset in the segment


class Frame(NamedTuple):
    seq: int
    flags: int
    payload: bytes
    end: int  # byte offset just after the frame
    lost: int = 0  # > 0: records seq .. seq + lost - 1 are damaged (no payload); the next
    # intact frame starts at ``end``


def frame(seq: int, payload: bytes, flags: int = 0) -> bytes:
    head = HEADER.pack(len(payload), seq, flags)
    return head + payload + CRC.pack(zlib.crc32(payload, zlib.crc32(head)))


def frames(data: bytes, start: int = 0, expect: int | None = None) -> Iterator[Frame]:
    """The frames in ``data`` from ``start``, up to where the intact data ends: a frame that
    is short or fails its CRC at the tail (a torn write, or one in progress) ends them.

    With ``expect``, the sequence number of the first frame, a frame that fails its CRC
    with an intact frame of a later number after it is damage in the middle, not a torn
    tail: it is given as a frame with ``lost`` records and no payload, and the frames after
    it follow (at most :data:`MAX_LOST` records in a row are looked past)."""
    pos = start
    while pos + HEADER.size <= len(data):
        found = _intact(data, pos)
        if found is None:
            if expect is None or (after := _next_intact(data, pos + 1, expect)) is None:
                return
            resumed, seq = after
            yield Frame(expect, 0, b"", resumed, seq - expect)
            pos, expect = resumed, seq
            continue
        yield found
        pos, expect = found.end, None if expect is None else found.seq + 1


def _intact(data: bytes, pos: int) -> Frame | None:
    """The frame at ``pos`` when it is whole and its CRC matches."""
    length, seq, flags = HEADER.unpack_from(data, pos)
    end = pos + HEADER.size + length + CRC.size
    if end > len(data):
        return None
    body = data[pos + HEADER.size : end - CRC.size]
    (crc,) = CRC.unpack_from(data, end - CRC.size)
    if crc != zlib.crc32(body, zlib.crc32(data[pos : pos + HEADER.size])):
        return None
    return Frame(seq, flags, body, end)


def _next_intact(data: bytes, start: int, expect: int) -> tuple[int, int] | None:
    """Where the first intact frame numbered ``expect + 1`` to ``expect + MAX_LOST`` starts
    after ``start``, and its number; None if there is none (the data ends torn)."""
    for seq in range(expect + 1, expect + MAX_LOST + 1):
        marker = SEQ.pack(seq)
        at = data.find(marker, start + SEQ_AT)
        while at != -1:
            pos = at - SEQ_AT
            if _intact(data, pos) is not None:
                return pos, seq
            at = data.find(marker, at + 1)
    return None


class _Log:
    """The directory both sides share: its segments and its groups' offsets."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
            raise ConfigError(f"data_buffer {url!r}: write a local log as file:///ABSOLUTE/DIR")
        query = parse_qs(parts.query)
        try:
            self.segment_bytes = int(query.get("segment_bytes", [SEGMENT_BYTES])[0])
        except ValueError:
            raise ConfigError(f"data_buffer {url!r}: segment_bytes must be a number") from None
        self.url = url
        self.dir = Path(parts.path)
        self.groups = self.dir / "groups"
        try:
            self.groups.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BufferUnavailable(f"cannot create the log directory {self.dir}: {e}") from e

    def segment(self, first: int) -> Path:
        return self.dir / f"{first:020d}.log"

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.log") if p.stem.isdigit())

    def offsets(self) -> dict[str, Position]:
        found = {}
        for path in self.groups.glob("*.offset"):
            try:
                found[path.stem] = Position(*map(int, path.read_text().split()))
            except (OSError, TypeError, ValueError):
                continue  # being replaced, or removed by hand: the next read sees it
        return found

    def low(self) -> int:
        """The slowest group's committed sequence number (0 before any group exists)."""
        return min((p.seq for p in self.offsets().values()), default=0)

    def write_offset(self, group: str, position: Position) -> None:
        final = self.groups / f"{group}.offset"
        temp = self.groups / f".{group}.offset.{os.getpid()}"
        with open(temp, "w") as f:
            f.write(" ".join(map(str, position)) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
        _fsync_dir(self.groups)

    def delete_behind(self, seq: int) -> None:
        """Delete each segment whose records all come before ``seq`` (never the last)."""
        segments = self.segments()
        for first, following in itertools.pairwise(segments):
            if following <= seq:
                self.segment(first).unlink(missing_ok=True)


class LogProducer:
    def __init__(self, url: str, options: BufferOptions) -> None:
        self.url = url
        self.options = options
        self.counts = ProducerCounts()
        self._log = _Log(url)
        self._lock = os.open(self._log.dir / "append.lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._threads = threading.Lock()  # flock does not exclude threads sharing our fd
        self._segment = -1  # the tail as last seen: segment, its intact end, next seq
        self._fd = -1
        self._end = 0
        self._next = 0
        self._zstd: Any = None
        if options.compression == "zstd":
            import zstandard

            self._zstd = zstandard

    def publish(self, steps: Sequence[Record]) -> None:
        """Append all of ``steps`` or none (one write); waits up to ``publish_timeout_s``
        for room, then ``overflow`` applies."""
        if not steps:
            return
        payloads = self._payloads(steps)  # encoded outside the lock
        n, limit = len(steps), self.options.max_pending
        deadline = time.monotonic() + self.options.publish_timeout_s
        while True:
            with self._locked():
                pending = self._next - self._log.low()
                if n <= limit and pending + n <= limit:
                    self._append(payloads)
                    self.counts.published += n
                    return
            if n > limit or time.monotonic() >= deadline:
                overflow(self.options, self.counts, n, self.url, pending)
                return
            time.sleep(FULL_POLL_S)

    def pending(self) -> int:
        with self._locked():
            return self._next - self._log.low()

    def flush(self, timeout_s: float = 10.0) -> None:
        """fsync the segment: what was published survives a power cut too."""
        with self._threads:
            if self._fd >= 0:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._threads:
            for fd in (self._fd, self._lock):
                if fd >= 0:
                    os.close(fd)
            self._fd = self._lock = -1

    def _payloads(self, steps: Sequence[Record]) -> list[tuple[bytes, int]]:
        if self._zstd is None:
            return [(encode(s), 0) for s in steps]
        compressor = self._zstd.ZstdCompressor(level=3)  # one per call: not thread-safe
        return [(compressor.compress(encode(s)), ZSTD) for s in steps]

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the append lock with the tail brought up to date."""
        with self._threads:
            if self._lock < 0:
                raise RuntimeError(f"producer of {self.url} is closed: open a new one")
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            try:
                self._refresh()
                yield
            except OSError as e:
                raise BufferUnavailable(f"cannot append to the log in {self._log.dir}: {e}") from e
            finally:
                fcntl.flock(self._lock, fcntl.LOCK_UN)

    def _refresh(self) -> None:
        """Catch up with other producers' appends; truncate a torn frame at the tail (we
        hold the lock, so it is not a write in progress: its writer died)."""
        segments = self._log.segments()
        last = segments[-1] if segments else 0
        if last != self._segment:
            self._open(last)
        size = os.fstat(self._fd).st_size
        if size == self._end:
            return
        data = os.pread(self._fd, size - self._end, self._end)
        intact = 0
        for f in frames(data, expect=self._next):
            if f.seq != self._next:
                break
            if f.lost:
                log.error(
                    "%s: records %d to %d are damaged (their CRC does not match) and "
                    "intact records follow; kept as they are, readers skip them",
                    self._log.segment(self._segment),
                    f.seq,
                    f.seq + f.lost - 1,
                )
            self._next, intact = f.seq + max(1, f.lost), f.end
        self._end += intact
        if self._end < size:
            log.warning(
                "%s: truncating %d bytes of a torn record at byte %d (its producer died "
                "mid-write; it was never acknowledged)",
                self._log.segment(self._segment),
                size - self._end,
                self._end,
            )
            os.ftruncate(self._fd, self._end)

    def _open(self, first: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        path = self._log.segment(first)
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._segment, self._end, self._next = first, 0, first

    def _append(self, payloads: list[tuple[bytes, int]]) -> None:
        if self._end >= self._log.segment_bytes:
            os.fsync(self._fd)  # the full segment is never written again
            self._open(self._next)
        data = b"".join(
            frame(self._next + i, payload, flags) for i, (payload, flags) in enumerate(payloads)
        )
        written = 0
        while written < len(data):
            written += os.write(self._fd, data[written:])
        self._end += len(data)
        self._next += len(payloads)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LogConsumer:
    def __init__(self, url: str, group: str, name: str, options: BufferOptions) -> None:
        check_group_name(group)
        self.url = url
        self.group = group
        self.name = name
        self.options = options
        self.counts = ConsumerCounts()
        self._log = _Log(url)
        self._group_lock = self._claim_group()
        self._committed = self._start()
        self._at = self._committed  # the next record to read
        self._fd = -1
        self._fd_segment = -1
        self._outstanding: deque[Delivery] = deque()  # delivered, not committed, in order
        self._reader = RecordReader(options, self.counts, log)
        # Skipped records, by the seq just before them: committed with the delivery there.
        self._skipped_after: dict[int, Position] = {}

    def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
        """Up to ``max_records`` in sequence, waiting up to ``timeout_s`` for the first."""
        self._check_open()
        deadline = time.monotonic() + timeout_s
        wait = 0.001
        while not (deliveries := self._read(max_records)):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(wait, left))
            wait = min(wait * 2, POLL_MAX_S)
        self._outstanding.extend(deliveries)
        self.counts.delivered += len(deliveries)
        return deliveries

    def commit(self, deliveries: Sequence[Delivery]) -> None:
        """Commit up to the last of ``deliveries`` (and so every delivery before it)."""
        self._check_open()
        if not deliveries:
            return
        top: Position = max(d.position for d in deliveries)
        if top.seq <= self._committed.seq:
            return  # already committed
        while top.seq in self._skipped_after:  # and the skipped records right after it
            top = self._skipped_after.pop(top.seq)
        self._write_committed(top)
        # Skipped records this cumulative commit passed: nothing is left to carry them.
        self._skipped_after = {k: v for k, v in self._skipped_after.items() if k > top.seq}
        done = []
        while self._outstanding and self._outstanding[0].position.seq <= top.seq:
            done.append(self._outstanding.popleft().step)
        self.counts.add_committed(done)

    def _write_committed(self, top: Position) -> None:
        try:
            self._log.write_offset(self.group, top)
            self._log.delete_behind(self._log.low())
        except OSError as e:
            raise BufferUnavailable(f"cannot commit to {self._log.groups}: {e}") from e
        self._committed = top

    def _skip(self, before: Position, after: Position) -> None:
        """A record skipped (poison, damage) between ``before`` and ``after``: committed at
        once when everything before it is, else with the delivery just before it."""
        if before.seq == self._committed.seq:
            self._write_committed(after)
        else:
            self._skipped_after[before.seq] = after

    def close(self) -> None:
        """Leave the group: the next consumer starts at the committed position."""
        for fd in (self._fd, self._group_lock):
            if fd >= 0:
                os.close(fd)
        self._fd = self._group_lock = -1

    def _check_open(self) -> None:
        if self._group_lock < 0:
            raise RuntimeError(f"consumer {self.name!r} of {self.url} is closed: open a new one")

    def _claim_group(self) -> int:
        path = self._log.groups / f"{self.group}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise BufferUnavailable(
                f"group {self.group!r} of {self.url} already has a live consumer ({holder}); "
                "a file:// log serves one consumer per group: stop it or use another group"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.name} pid {os.getpid()}".encode(), 0)
        return fd

    def _start(self) -> Position:
        """The group's committed position; a new group starts at the oldest record kept."""
        found = self._log.offsets().get(self.group)
        if found is not None:
            return found
        first = (self._log.segments() or [0])[0]
        start = Position(first, first, 0)
        self._log.write_offset(self.group, start)
        return start

    def _read(self, max_records: int) -> list[Delivery]:
        out: list[Delivery] = []
        while len(out) < max_records:
            got = self._read_segment(max_records - len(out))
            out.extend(got)
            if not got and not self._next_segment():
                break
        return out

    def _read_segment(self, max_records: int) -> list[Delivery]:
        if not self._open_segment():
            return []
        at = self._at
        data = os.pread(self._fd, READ_BYTES, at.offset)
        if len(data) >= HEADER.size:  # a record larger than one read: read all of it
            length = HEADER.unpack_from(data)[0]
            data = os.pread(self._fd, max(READ_BYTES, HEADER.size + length + CRC.size), at.offset)
        out: list[Delivery] = []
        for f in frames(data, expect=at.seq):
            if len(out) == max_records:
                break
            if f.seq != at.seq:
                raise BufferUnavailable(
                    f"{self._log.segment(at.segment)}: record {f.seq} where {at.seq} was "
                    "expected; the log was changed by hand, delete the group's offset file "
                    "to start again from the oldest record"
                )
            where = functools.partial(self._where, at.segment, f.seq)
            before, at = at, Position(at.seq + max(1, f.lost), at.segment, self._at.offset + f.end)
            if f.lost:
                self._reader.skipped(where(), "damaged: its CRC does not match", records=f.lost)
                self._skip(before, at)
                continue
            record = self._reader.read(f.payload, compressed=bool(f.flags & ZSTD), where=where)
            if record is None:  # a poison record
                self._skip(before, at)
            else:
                out.append(Delivery(record, at))
        self._at = at
        return out

    def _where(self, segment: int, seq: int) -> str:
        return f"{self._log.segment(segment)} record {seq}"

    def _open_segment(self) -> bool:
        """Open the segment holding the next record; False while the log is empty."""
        if self._fd >= 0 and self._fd_segment == self._at.segment:
            return True
        segments = self._log.segments()
        if not segments:
            return False
        if self._at.segment not in segments:  # deleted, or an old offset: find the record
            self._at = self._locate(segments)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self._log.segment(self._at.segment), os.O_RDONLY)
        self._fd_segment = self._at.segment
        return True

    def _locate(self, segments: list[int]) -> Position:
        holding = [s for s in segments if s <= self._at.seq] or segments[:1]
        first = holding[-1]
        at = Position(max(first, self._at.seq), first, 0)
        with open(self._log.segment(first), "rb") as f:
            for fr in frames(f.read(), expect=first):
                if fr.seq >= at.seq:
                    break
                at = Position(at.seq, first, fr.end)
        return at

    def _next_segment(self) -> bool:
        """Move on once every record of this segment is read: the next segment starts
        with the next sequence number (producers rotate only after an intact frame)."""
        later = [s for s in self._log.segments() if s > self._at.segment]
        if not later or later[0] != self._at.seq:
            return False
        self._at = Position(self._at.seq, later[0], 0)
        return True
