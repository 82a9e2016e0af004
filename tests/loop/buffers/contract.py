"""The contract every experience buffer keeps (``loop.buffers.base``), checked against the
real thing: a backend's test module subclasses :class:`BufferContract` and provides a
``backend`` fixture returning a :class:`Backend` for a fresh, empty buffer::

    class TestRedis(BufferContract):
        timeout_s = 10.0  # optional: more time for backends that settle slowly

        @pytest.fixture
        def backend(self, redis_server) -> Backend:
            return Backend(f"redis://127.0.0.1:{port}/0?stream=t-{uuid4().hex}", True)

Every producer and consumer opened through the ``Backend`` is closed after the test.
Assertions are made from the records themselves (keys, steps, versions), not from the
backend's own counters alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loop.buffers import open_consumer, open_producer
from loop.buffers.base import BufferFull, BufferOptions, Consumer, Delivery, Overflow, Producer
from loop.experience import Completion, Deduplicator, Record, Step

ROOT = Path(__file__).resolve().parents[3]  # the repository: children import tests.* from it


Inject = Callable[[bytes, str], None]


@dataclass
class Backend:
    url: str  # a fresh, empty buffer per test (unique name/dir/stream/topic)
    crosses_processes: bool  # False for memory:// (skip the subprocess tests)
    # Appends raw bytes as one record of a stream (an episode), as a careless or hostile
    # publisher would; None where records travel as objects (memory://).
    inject: Inject | None = None
    _opened: list[Producer | Consumer] = field(default_factory=list, repr=False)

    def producer(self, **overrides: Any) -> Producer:
        producer = open_producer(self.url, BufferOptions(**overrides))
        self._opened.append(producer)
        return producer

    def consumer(self, group: str = "trainer", name: str = "c1", **overrides: Any) -> Consumer:
        consumer = open_consumer(self.url, group, name, BufferOptions(**overrides))
        self._opened.append(consumer)
        return consumer

    def close_all(self) -> None:
        """Close everything opened here (closing twice must be harmless)."""
        while self._opened:
            self._opened.pop().close()


# -- records ---------------------------------------------------------------------------


def make_step(episode_id: str, step: int, *, last: bool = False, version: int = 1) -> Step:
    """A step whose every field follows from (episode_id, step): a child process makes
    the same records, and a test can check any delivery against ``make_step`` again."""
    seed = sum(episode_id.encode()) * 1000 + step
    rng = np.random.default_rng(seed)
    return Step(
        episode_id=episode_id,
        step=step,
        observation=rng.standard_normal(4).astype(np.float32),
        action=np.asarray(seed % 2, dtype=np.int64),
        log_prob=float(-rng.random()),
        value=float(rng.standard_normal()),
        reward=1.0,
        terminated=last,
        truncated=False,
        model_version=version,
        served_at=1.7e9 + seed / 1000,
    )


def make_completion(group_id: str, index: int, *, size: int = 4, version: int = 1) -> Completion:
    """A completion whose every field follows from (group_id, index), as ``make_step``."""
    seed = sum(group_id.encode()) * 1000 + index
    rng = np.random.default_rng(seed)
    length = 1 + seed % 7
    return Completion(
        group_id=group_id,
        index=index,
        group_size=size,
        prompt_ids=rng.integers(0, 500, 5).astype(np.int32),
        completion_ids=rng.integers(0, 500, length).astype(np.int32),
        log_probs=-rng.random(length),
        reward=float(index % 2),
        finish_reason="stop" if index % 3 else "length",
        model_version=version,
        served_at=1.7e9 + seed / 1000,
    )


def episode(episode_id: str, length: int, *, version: int = 1) -> list[Step]:
    return [make_step(episode_id, i, last=i == length - 1, version=version) for i in range(length)]


def stepped(record: Record) -> Step:
    """A delivered record that must be an environment step."""
    assert isinstance(record, Step), record
    return record


def assert_same_step(got: Record, want: Step) -> None:
    """Every field equal; arrays equal in dtype, shape and values."""
    got = stepped(got)
    for name in Step.__slots__:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray), name
            assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
            assert a.shape == b.shape, (name, a.shape, b.shape)
            assert np.array_equal(a, b), name
        else:
            assert type(a) is type(b), (name, a, b)
            assert a == b, (name, a, b)


def keys(deliveries: Iterable[Delivery]) -> list[str]:
    return [d.step.key for d in deliveries]


# -- consuming -------------------------------------------------------------------------


def drain(
    consumer: Consumer, expected: int, timeout_s: float, *, batch: int | None = None
) -> list[Delivery]:
    """Poll until ``expected`` deliveries arrived or ``timeout_s`` passed (backends that
    settle eventually, such as Kafka after a rebalance, need the loop). Returns what came,
    perhaps more than ``expected``; the caller asserts."""
    got: list[Delivery] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        want = batch or expected - len(got)
        got.extend(consumer.poll(max_records=want, timeout_s=min(left, 0.5)))
    return got


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


def child(*args: str) -> subprocess.Popen[str]:
    """``python -m tests.loop.buffers.child ARGS`` from the repository root."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.loop.buffers.child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def read_report(proc: subprocess.Popen[str], word: str, timeout_s: float) -> int:
    """The count from the child's ``WORD n`` line (the child has its own deadline, so the
    line comes; a crash shows its stderr)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(word):
        proc.kill()
        _, err = proc.communicate(timeout=timeout_s)
        pytest.fail(f"child said {line!r}, expected {word} n; stderr:\n{err}")
    return int(line.split()[1])


# -- the contract ----------------------------------------------------------------------


class BufferContract:
    """The shared suite. Subclasses provide the ``backend`` fixture; they may raise
    ``timeout_s`` (how long a drain may take) and ``quiet_s`` (how long to listen to be
    sure nothing more comes)."""

    timeout_s: float = 5.0
    quiet_s: float = 0.3

    @pytest.fixture(autouse=True)
    def _close_opened(self, backend: Backend) -> Iterable[None]:
        yield
        backend.close_all()

    def assert_quiet(self, consumer: Consumer) -> None:
        extra = consumer.poll(max_records=100, timeout_s=self.quiet_s)
        assert extra == [], f"unexpected deliveries {keys(extra)}"

    def test_steps_round_trip_exactly(self, backend: Backend) -> None:
        steps = [
            make_step("rt", 0),
            Step(
                "rt",
                1,
                observation=np.arange(3 * 8 * 8, dtype=np.uint8).reshape(3, 8, 8),
                action=np.array([[0.25, -1.5]], dtype=np.float64),
                log_prob=-0.1234567890123,
                value=3.5e-12,
                reward=-1.0,
                terminated=False,
                truncated=True,
                model_version=2**40,
                served_at=1712345678.123456,
            ),
            Step(
                "rt-ü/2",
                0,
                observation=np.array([True, False]),
                action=np.array([], dtype=np.int16),
                log_prob=0.0,
                value=-0.0,
                reward=0.0,
                terminated=True,
                truncated=False,
                model_version=0,
                served_at=0.0,
            ),
        ]
        producer = backend.producer()
        producer.publish(steps)
        producer.flush()
        consumer = backend.consumer()
        got = drain(consumer, len(steps), self.timeout_s)
        by_key = {d.step.key: d.step for d in got}
        assert sorted(by_key) == sorted(s.key for s in steps)
        for want in steps:
            assert_same_step(by_key[want.key], want)

    def test_completions_round_trip_exactly_in_group_order(self, backend: Backend) -> None:
        """A language model's records ride the same buffers: a group whole, in order."""
        group = [make_completion("g-ü", index, size=5, version=3) for index in range(5)]
        producer = backend.producer()
        producer.publish(group)
        producer.flush()
        got = [d.step for d in drain(backend.consumer(), len(group), self.timeout_s)]
        assert [record.key for record in got] == [c.key for c in group]
        for record, want in zip(got, group, strict=True):
            assert isinstance(record, Completion)
            for name in Completion.__slots__:
                a, b = getattr(record, name), getattr(want, name)
                if isinstance(b, np.ndarray):
                    assert a.dtype == b.dtype, name
                    assert np.array_equal(a, b), name
                else:
                    assert a == b, name

    def test_order_within_episode(self, backend: Backend) -> None:
        episodes = {f"ep{e}": episode(f"ep{e}", 30) for e in range(20)}
        producer = backend.producer()
        for start in range(0, 30, 7):  # each publish mixes every episode's next chunk
            for group in (list(episodes)[:11], list(episodes)[11:]):
                producer.publish([s for e in group for s in episodes[e][start : start + 7]])
        producer.flush()
        consumer = backend.consumer()
        seen: dict[str, list[int]] = defaultdict(list)
        polls = 0
        deadline = time.monotonic() + self.timeout_s
        total = 0
        while total < 600 and time.monotonic() < deadline:
            batch = consumer.poll(max_records=37, timeout_s=0.5)
            polls += bool(batch)
            total += len(batch)
            for d in batch:
                seen[d.step.stream].append(d.step.position)
                assert_same_step(d.step, episodes[d.step.stream][d.step.position])
            consumer.commit(batch)
        assert total == 600
        assert polls > 1
        assert {e: seen[e] for e in episodes} == {e: list(range(30)) for e in episodes}

    def test_at_least_once_redelivers_uncommitted(self, backend: Backend) -> None:
        steps = episode("a", 6) + episode("b", 4)
        producer = backend.producer()
        producer.publish(steps)
        producer.flush()
        first = backend.consumer(name="c1")
        got = drain(first, len(steps), self.timeout_s)
        assert sorted(keys(got)) == sorted(s.key for s in steps)
        first.close()  # nothing committed

        again = backend.consumer(name="c1")
        redelivered = drain(again, len(steps), self.timeout_s)
        assert sorted(keys(redelivered)) == sorted(s.key for s in steps)
        dedupe = Deduplicator()
        fresh = [d.step.key for d in got + redelivered if dedupe.fresh(d.step)]
        assert sorted(fresh) == sorted(s.key for s in steps)
        assert dedupe.duplicates == len(steps)

    def test_restart_resumes_after_commit(self, backend: Backend) -> None:
        steps = episode("a", 10) + episode("b", 10)
        producer = backend.producer()
        producer.publish(steps)
        producer.flush()
        consumer = backend.consumer(name="c1")
        got = drain(consumer, len(steps), self.timeout_s)
        assert len(got) == len(steps)
        consumer.commit(got[:12])
        consumer.close()

        later = episode("c", 5)
        producer.publish(later)
        producer.flush()
        restarted = backend.consumer(name="c1")
        expected = {d.step.key for d in got[12:]} | {s.key for s in later}
        resumed = drain(restarted, len(expected), self.timeout_s)
        assert sorted(keys(resumed)) == sorted(expected)  # nothing committed comes again
        restarted.commit(resumed)
        self.assert_quiet(restarted)

    def test_consumer_killed_mid_batch_loses_nothing(self, backend: Backend) -> None:
        if not backend.crosses_processes:
            pytest.skip("the buffer lives in one process")
        steps = [s for e in range(3) for s in episode(f"k{e}", 10)]
        producer = backend.producer()
        producer.publish(steps)
        producer.flush()
        proc = child("consume", backend.url, "trainer", "c1", str(len(steps)), str(self.timeout_s))
        try:
            delivered = read_report(proc, "DELIVERED", self.timeout_s)
            assert delivered > 0
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=self.timeout_s)
        assert proc.returncode == -signal.SIGKILL

        consumer = backend.consumer(name="c1")
        got = drain(consumer, len(steps), self.timeout_s)
        assert sorted(set(keys(got))) == sorted(s.key for s in steps)

    def test_producer_in_another_process(self, backend: Backend) -> None:
        if not backend.crosses_processes:
            pytest.skip("the buffer lives in one process")
        consumer = backend.consumer()
        proc = child("produce", backend.url, "4", "25")
        published = read_report(proc, "PUBLISHED", self.timeout_s)
        _, err = proc.communicate(timeout=self.timeout_s)
        assert proc.returncode == 0, err
        assert published == 100
        got = drain(consumer, published, self.timeout_s)
        assert len(got) == published
        seen: dict[str, list[int]] = defaultdict(list)
        for d in got:
            want = make_step(d.step.stream, d.step.position, last=d.step.position == 24)
            assert_same_step(d.step, want)
            seen[d.step.stream].append(d.step.position)
        assert seen == {f"p{e}": list(range(25)) for e in range(4)}

    def test_back_pressure(self, backend: Backend) -> None:
        n = 8
        steps = episode("bp", n + 4)
        producer = backend.producer(max_pending=n, publish_timeout_s=0.2)
        producer.publish(steps[:n])
        producer.flush()
        started = time.monotonic()
        with pytest.raises(BufferFull):
            producer.publish(steps[n : n + 1])
        elapsed = time.monotonic() - started
        assert 0.18 <= elapsed < 0.2 + 1.5, elapsed
        assert producer.counts.published == n
        assert producer.counts.dropped == 0

        dropping = backend.producer(max_pending=n, publish_timeout_s=0.2, overflow=Overflow.DROP)
        dropping.publish(steps[n : n + 3])  # returns: dropped and counted
        assert dropping.counts.dropped == 3
        assert dropping.counts.published == 0

        consumer = backend.consumer()
        got = drain(consumer, n, self.timeout_s)
        assert keys(got) == [s.key for s in steps[:n]]  # the dropped steps never arrive
        consumer.commit(got)
        again = backend.producer(max_pending=n, publish_timeout_s=self.timeout_s)
        again.publish(steps[n : n + 1])  # room again once the consumer committed
        again.flush()
        assert again.counts.published == 1
        assert keys(drain(consumer, 1, self.timeout_s)) == [steps[n].key]

    def test_a_poison_record_is_skipped_and_the_rest_delivered(self, backend: Backend) -> None:
        """Bytes that are not a record, between good ones and after the last: the good ones
        are delivered, the poison is counted, leaves nothing pending once they are committed
        and is never read again."""
        if backend.inject is None:
            pytest.skip("records travel as objects here: none can fail to decode")
        producer = backend.producer()
        producer.publish(episode("a", 3))
        producer.flush()
        backend.inject(b"\xc1", "b")  # msgpack's one never-used byte
        producer.publish(episode("b", 3))
        producer.flush()
        backend.inject(b"\xc1", "b")
        consumer = backend.consumer()
        got = drain(consumer, 6, self.timeout_s)
        assert sorted(keys(got)) == sorted(f"{e}:{i}" for e in "ab" for i in range(3))
        wait_for(lambda: consumer.poll(1, 0) == [] and consumer.counts.undecodable == 2,
                 self.timeout_s, "both poison records read")  # fmt: skip
        consumer.commit(got)
        consumer.close()
        wait_for(lambda: producer.pending() == 0, self.timeout_s, "pending() == 0")
        again = backend.consumer()
        self.assert_quiet(again)
        assert again.counts.undecodable == 0

    def test_accounting_balances(self, backend: Backend) -> None:
        steps = [make_step(f"acc{e}", i, version=1 + i // 4) for e in range(4) for i in range(10)]
        producer = backend.producer()
        producer.publish(steps)
        producer.flush()
        consumer = backend.consumer()
        got = drain(consumer, len(steps), self.timeout_s)
        assert len(got) == len(steps)
        assert consumer.counts.delivered == len(steps)
        consumer.commit(got[:25])
        wait_for(lambda: producer.pending() == 15, self.timeout_s, "pending() == 15")
        assert producer.counts.published == consumer.counts.committed + producer.pending()
        assert consumer.counts.committed == 25
        assert consumer.counts.by_version == dict(Counter(d.step.model_version for d in got[:25]))
