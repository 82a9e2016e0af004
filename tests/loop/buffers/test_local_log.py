"""file:// (the local append-only log) against the shared contract, plus what only a log
on disk does: torn frames, segment rotation and deletion, compression, one consumer per
group, several producer processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from kernel.errors import ConfigError
from loop.buffers import open_consumer, open_producer
from loop.buffers.base import BufferOptions, BufferUnavailable, Producer
from loop.buffers.local_log import HEADER, ZSTD, LogConsumer, frame, frames
from loop.experience import encode
from tests.loop.buffers.contract import (
    Backend,
    BufferContract,
    assert_same_step,
    child,
    drain,
    episode,
    keys,
    make_step,
    read_report,
)


def append_frame(log_dir: Path, data: bytes, flags: int = 0) -> None:
    """A frame of raw bytes after the log's last record, as a foreign writer would add it."""
    last = segment_files(log_dir)[-1]
    intact = list(frames(last.read_bytes()))
    seq = intact[-1].seq + 1 if intact else int(last.stem)
    with open(last, "ab") as f:
        f.write(frame(seq, data, flags))


def appender(log_dir: Path) -> Callable[[bytes, str], None]:
    return lambda data, _: append_frame(log_dir, data)


class TestLocalLog(BufferContract):
    @pytest.fixture
    def backend(self, tmp_path):
        url = f"file://{tmp_path}/log?segment_bytes=4096"
        return Backend(url, crosses_processes=True, inject=appender(tmp_path / "log"))


class ZstdBackend(Backend):
    def producer(self, **overrides: Any) -> Producer:
        return super().producer(**{"compression": "zstd", **overrides})


class TestLocalLogZstd(BufferContract):
    @pytest.fixture
    def backend(self, tmp_path):
        inject = appender(tmp_path / "log")
        return ZstdBackend(f"file://{tmp_path}/log", crosses_processes=True, inject=inject)


@pytest.fixture
def log_dir(tmp_path) -> Path:
    return tmp_path / "log"


def url_of(log_dir: Path, **query: int) -> str:
    tail = "&".join(f"{k}={v}" for k, v in query.items())
    return f"file://{log_dir}" + (f"?{tail}" if tail else "")


def segment_files(log_dir: Path) -> list[Path]:
    return sorted(log_dir.glob("*.log"))


def test_a_torn_last_frame_is_skipped_then_truncated(log_dir):
    url = url_of(log_dir)
    producer = open_producer(url)
    producer.publish(episode("a", 5))
    producer.close()
    (segment,) = segment_files(log_dir)
    intact = segment.stat().st_size
    with open(segment, "ab") as f:  # a producer killed mid-write
        f.write(frame(5, encode(make_step("a", 5)))[:-7])

    consumer = open_consumer(url, "g", "c")
    assert keys(drain(consumer, 6, 0.3)) == [f"a:{i}" for i in range(5)]

    again = open_producer(url)  # truncates the torn frame, then appends
    again.publish(episode("b", 3))
    assert keys(drain(consumer, 3, 2.0)) == ["b:0", "b:1", "b:2"]
    data = segment.read_bytes()
    assert [f.seq for f in frames(data)] == list(range(8))
    assert frames_end(data) == len(data) > intact


def test_a_corrupt_last_frame_is_not_delivered(log_dir):
    url = url_of(log_dir)
    open_producer(url).publish(episode("a", 3))
    (segment,) = segment_files(log_dir)
    data = bytearray(segment.read_bytes())
    data[-6] ^= 0xFF  # inside the last frame's payload: its CRC no longer matches
    segment.write_bytes(bytes(data))
    consumer = open_consumer(url, "g", "c")
    assert keys(drain(consumer, 3, 0.3)) == ["a:0", "a:1"]
    open_producer(url).publish(episode("b", 1))
    assert keys(drain(consumer, 1, 2.0)) == ["b:0"]  # seq 2 again: the corrupt one is gone


def test_damage_in_the_middle_skips_one_record_and_keeps_the_rest(log_dir):
    """A flipped byte inside record 2 of 5: the consumer skips it and delivers 3 and 4; the
    next producer keeps them (it truncates only a torn tail) and appends after them."""
    url = url_of(log_dir)
    open_producer(url).publish(episode("a", 5))
    (segment,) = segment_files(log_dir)
    data = bytearray(segment.read_bytes())
    second = list(frames(bytes(data)))[2]
    data[second.end - 8] ^= 0xFF  # inside record 2's payload
    segment.write_bytes(bytes(data))
    consumer = open_consumer(url, "g", "c")
    got = drain(consumer, 4, 2.0)
    assert keys(got) == ["a:0", "a:1", "a:3", "a:4"]
    assert consumer.counts.undecodable == 1
    again = open_producer(url)
    again.publish(episode("b", 3))
    assert keys(drain(consumer, 3, 2.0)) == ["b:0", "b:1", "b:2"]
    assert [f.seq for f in frames(segment.read_bytes(), expect=0)] == list(range(8))
    consumer.commit(got)


def test_a_compressed_record_past_max_record_bytes_is_skipped(log_dir):
    """A zstd frame holding 64 MiB of zeros (2 KB on disk) is refused by its declared size
    before anything is decompressed; the records around it are delivered."""
    url = url_of(log_dir)
    producer = open_producer(url)
    producer.publish(episode("a", 1))
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))
    append_frame(log_dir, bomb, ZSTD)
    producer.publish(episode("b", 1))
    consumer = open_consumer(url, "g", "c", BufferOptions(max_record_bytes=1 << 20))
    assert keys(drain(consumer, 2, 2.0)) == ["a:0", "b:0"]
    assert consumer.counts.undecodable == 1


def frames_end(data: bytes) -> int:
    return max((f.end for f in frames(data)), default=0)


def test_segments_behind_every_group_are_deleted(log_dir):
    url = url_of(log_dir, segment_bytes=1024)
    producer = open_producer(url)
    steps = [s for e in range(6) for s in episode(f"e{e}", 10)]
    for start in range(0, 60, 5):
        producer.publish(steps[start : start + 5])
    first_segments = segment_files(log_dir)
    assert len(first_segments) > 3

    fast, slow = open_consumer(url, "fast", "c"), open_consumer(url, "slow", "c")
    fast.commit(drain(fast, 60, 2.0))
    assert segment_files(log_dir) == first_segments  # "slow" still needs them all
    half = drain(slow, 30, 2.0)[:30]
    slow.commit(half)
    kept = segment_files(log_dir)
    assert first_segments[0] not in kept
    assert len(kept) < len(first_segments)
    slow.close()

    resumed = open_consumer(url, "slow", "c")  # its segment may be gone: found by seq
    rest = drain(resumed, 30, 2.0)
    assert keys(rest) == [s.key for s in steps[30:]]
    resumed.commit(rest)
    assert segment_files(log_dir) == first_segments[-1:]  # the last one is never deleted
    assert producer.pending() == 0


def test_a_group_created_after_deletion_starts_at_the_oldest_record_kept(log_dir):
    url = url_of(log_dir, segment_bytes=1024)
    producer = open_producer(url)
    for e in range(8):
        producer.publish(episode(f"e{e}", 5))
    only = open_consumer(url, "only", "c")
    only.commit(drain(only, 40, 2.0))
    oldest = int(segment_files(log_dir)[0].stem)
    late = open_consumer(url, "late", "c")
    got = drain(late, 40 - oldest, 2.0)
    assert len(got) == 40 - oldest
    assert got[0].position.seq == oldest + 1
    assert producer.pending() == 40 - oldest


def test_zstd_frames_are_flagged_smaller_and_round_trip(log_dir):
    url = url_of(log_dir)
    step = make_step("z", 0)
    big = type(step)(
        **{
            **{n: getattr(step, n) for n in step.__slots__},
            "observation": np.zeros((64, 64), np.float32),
        }
    )
    open_producer(url, BufferOptions(compression="zstd")).publish([big])
    open_producer(url).publish([big])
    (segment,) = segment_files(log_dir)
    compressed, plain = frames(segment.read_bytes())
    assert compressed.flags == ZSTD
    assert plain.flags == 0
    assert len(compressed.payload) < len(plain.payload) / 10
    for d in drain(open_consumer(url, "g", "c"), 2, 2.0):
        assert_same_step(d.step, big)


def test_a_record_larger_than_one_read(log_dir):
    url = url_of(log_dir)
    step = make_step("big", 0)
    huge = type(step)(
        **{
            **{n: getattr(step, n) for n in step.__slots__},
            "observation": np.arange(400_000, dtype=np.float32),
        }
    )
    open_producer(url).publish([huge, make_step("big", 1)])
    got = drain(open_consumer(url, "g", "c"), 2, 2.0)
    assert_same_step(got[0].step, huge)
    assert keys(got) == ["big:0", "big:1"]


def test_one_live_consumer_per_group(log_dir):
    url = url_of(log_dir)
    first = open_consumer(url, "g", "c1")
    with pytest.raises(BufferUnavailable, match=r"c1 pid \d+.*use another group"):
        open_consumer(url, "g", "c2")
    open_consumer(url, "other", "c2").close()
    first.close()
    open_consumer(url, "g", "c2").close()


def test_pending_counts_everything_before_a_group(log_dir):
    url = url_of(log_dir)
    producer = open_producer(url)
    producer.publish(episode("a", 4))
    assert producer.pending() == 4
    consumer = open_consumer(url, "g", "c")
    consumer.commit(drain(consumer, 4, 2.0)[:1])
    assert producer.pending() == 3
    assert (log_dir / "groups" / "g.offset").read_text().split()[0] == "1"


def test_producer_processes_append_concurrently(log_dir):
    url = url_of(log_dir, segment_bytes=8192)
    consumer = open_consumer(url, "g", "c")
    procs = [child("produce", url, "4", "50", prefix) for prefix in "abc"]
    for proc in procs:
        assert read_report(proc, "PUBLISHED", 20) == 200
        proc.communicate(timeout=20)  # reaped, its pipes closed
        assert proc.returncode == 0
    got = drain(consumer, 600, 5.0)
    assert [d.position.seq for d in got] == list(range(1, 601))
    seen: dict[str, list[int]] = {}
    for d in got:
        seen.setdefault(d.step.stream, []).append(d.step.position)
    assert seen == {f"{p}{e}": list(range(50)) for p in "abc" for e in range(4)}
    assert len(segment_files(log_dir)) > 1


@pytest.mark.parametrize(
    "bad",
    ["file://relative/dir", "file://host/dir", "file:///tmp/x?segment_bytes=lots"],
)
def test_bad_urls_are_refused(bad):
    with pytest.raises(ConfigError, match=r"file:///|segment_bytes"):
        open_producer(bad)


@pytest.mark.parametrize("group", ["../escape", "", "g" * 201, "g" * 300])
def test_bad_group_names_are_refused(log_dir, group):
    # 300 characters made a file name too long: a raw OSError before the names were bounded.
    with pytest.raises(ConfigError, match=r"consumer group .*1 to 200 letters, digits"):
        open_consumer(url_of(log_dir), group, "c")
    assert not list((log_dir / "groups").glob("*g*"))


def test_the_longest_group_name_works(log_dir):
    group = "g" * 200
    producer = open_producer(url_of(log_dir))
    producer.publish(episode("e", 2))
    consumer = open_consumer(url_of(log_dir), group, "c")
    consumer.commit(consumer.poll(10, 1.0))
    assert consumer.counts.committed == 2
    consumer.close()
    producer.close()


def test_header_is_the_documented_layout():
    data = frame(7, b"xyz", ZSTD)
    assert HEADER.unpack_from(data) == (3, 7, ZSTD)
    assert len(data) == HEADER.size + 3 + 4


def test_threads_share_one_producer(log_dir):
    url = url_of(log_dir, segment_bytes=4096)
    producer = open_producer(url, BufferOptions(compression="zstd"))

    def work(worker: int) -> None:
        for e in range(5):
            for i in range(0, 10, 2):
                producer.publish(episode(f"t{worker}e{e}", 10)[i : i + 2])

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = drain(open_consumer(url, "g", "c"), 200, 5.0)
    assert [d.position.seq for d in got] == list(range(1, 201))
    seen: dict[str, list[int]] = {}
    for d in got:
        seen.setdefault(d.step.stream, []).append(d.step.position)
    assert seen == {f"t{w}e{e}": list(range(10)) for w in range(4) for e in range(5)}


def test_a_producer_killed_while_appending_leaves_a_readable_log(log_dir):
    """SIGKILL a producer process at a random moment of a stream of appends: whatever it
    wrote is a clean prefix of each episode, and the log takes new appends."""
    url = url_of(log_dir, segment_bytes=16384)
    proc = child("produce", url, "2000", "25", "k")
    deadline = time.monotonic() + 20
    while not segment_files(log_dir) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # appending now
    proc.kill()
    proc.communicate(timeout=10)
    producer = open_producer(url)
    producer.publish(episode("after", 3))
    consumer = open_consumer(url, "g", "c")
    stored = sum(len(list(frames(f.read_bytes()))) for f in segment_files(log_dir))
    got = drain(consumer, stored, 5.0, batch=500)
    assert len(got) == stored  # every intact record, the torn one truncated
    assert keys(got)[-3:] == ["after:0", "after:1", "after:2"]
    seen: dict[str, list[int]] = {}
    for d in got:
        seen.setdefault(d.step.stream, []).append(d.step.position)
    assert all(steps == list(range(len(steps))) for steps in seen.values())
    assert [d.position.seq for d in got] == list(range(1, len(got) + 1))
    assert 3 < len(got) < 50_003  # killed mid-stream


def test_skipped_records_a_commit_passed_are_not_kept(log_dir):
    """Poison records in the middle of what a commit covers are passed by it (commits are
    cumulative): the consumer keeps nothing of them, however many it met."""
    url = url_of(log_dir)
    producer = open_producer(url)
    for n in range(20):
        producer.publish(episode(f"e{n}", 2))
        append_frame(log_dir, b"\xc1")
    producer.publish(episode("last", 1))
    consumer = open_consumer(url, "g", "c")
    got = drain(consumer, 41, 2.0)
    assert consumer.counts.undecodable == 20
    consumer.commit(got)
    assert isinstance(consumer, LogConsumer)
    assert consumer._skipped_after == {}
    assert producer.pending() == 0
