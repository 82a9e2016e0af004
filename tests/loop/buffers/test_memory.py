"""memory:// against the shared contract, plus what only an in-process buffer does."""

from __future__ import annotations

import threading
import time
from uuid import uuid4

import pytest

from kernel.errors import ConfigError
from loop.buffers import memory, open_consumer, open_producer
from loop.buffers.base import BufferFull, BufferOptions
from tests.loop.buffers.contract import Backend, BufferContract, episode, keys, stepped


class TestMemory(BufferContract):
    @pytest.fixture
    def backend(self):
        url = f"memory://test-{uuid4().hex}"
        yield Backend(url, crosses_processes=False)
        memory.discard(url)


@pytest.fixture
def url():
    url = f"memory://test-{uuid4().hex}"
    yield url
    memory.discard(url)


def test_a_name_is_one_buffer_per_process(url):
    open_producer(url).publish(episode("a", 3))
    assert keys(open_consumer(url, "g", "c").poll(10, 0)) == ["a:0", "a:1", "a:2"]
    other = f"memory://other-{uuid4().hex}"
    assert open_consumer(other, "g", "c").poll(10, 0) == []
    memory.discard(other)


def test_published_arrays_are_copied_and_read_only(url):
    step = episode("a", 1)[0]
    open_producer(url).publish([step])
    step.observation[0] = 99.0  # a worker reusing its buffer
    got = stepped(open_consumer(url, "g", "c").poll(1, 0)[0].step)
    assert got.observation[0] != 99.0
    with pytest.raises(ValueError, match="read-only"):
        got.observation[0] = 1.0


def test_pending_counts_everything_before_a_group_then_the_slowest_group(url):
    producer = open_producer(url)
    producer.publish(episode("a", 5))
    assert producer.pending() == 5
    fast, slow = open_consumer(url, "fast", "c"), open_consumer(url, "slow", "c")
    fast.commit(fast.poll(10, 0))
    assert producer.pending() == 5  # "slow" has committed nothing
    slow.commit(slow.poll(3, 0))
    assert producer.pending() == 2


def test_groups_each_see_every_record(url):
    open_producer(url).publish(episode("a", 4))
    one, two = open_consumer(url, "one", "c"), open_consumer(url, "two", "c")
    assert keys(one.poll(10, 0)) == keys(two.poll(10, 0)) == [f"a:{i}" for i in range(4)]


def test_consumers_of_a_group_share_the_work(url):
    open_producer(url).publish(episode("a", 6))
    first, second = open_consumer(url, "g", "c1"), open_consumer(url, "g", "c2")
    a, b = first.poll(4, 0), second.poll(4, 0)
    assert keys(a) + keys(b) == [f"a:{i}" for i in range(6)]
    first.close()  # its four come back to the front of the group, in order
    assert keys(second.poll(10, 0)) == keys(a)


def test_committed_records_are_released(url):
    producer = open_producer(url)
    producer.publish(episode("a", 10))
    consumer = open_consumer(url, "g", "c")
    got = consumer.poll(10, 0)
    consumer.commit(got[:7])
    assert len(memory.buffer(url).records) == 3
    late = open_consumer(url, "late", "c")  # joins after the release: oldest held first
    assert keys(late.poll(10, 0)) == ["a:7", "a:8", "a:9"]


def test_commit_of_a_foreign_or_repeated_delivery_is_ignored(url):
    open_producer(url).publish(episode("a", 2))
    one, other = open_consumer(url, "g", "c1"), open_consumer(url, "g", "c2")
    got = one.poll(2, 0)
    other.commit(got)
    one.commit(got)
    one.commit(got)
    assert other.counts.committed == 0
    assert one.counts.committed == 2


def test_poll_wakes_when_a_thread_publishes(url):
    consumer = open_consumer(url, "g", "c")
    producer = open_producer(url)
    timer = threading.Timer(0.05, producer.publish, [episode("a", 1)])
    timer.start()
    started = time.monotonic()
    assert keys(consumer.poll(1, 2.0)) == ["a:0"]
    assert time.monotonic() - started < 1.0
    timer.join()


def test_blocked_publish_resumes_when_a_commit_makes_room(url):
    producer = open_producer(url, BufferOptions(max_pending=3, publish_timeout_s=2.0))
    consumer = open_consumer(url, "g", "c")
    producer.publish(episode("a", 3))
    timer = threading.Timer(0.05, lambda: consumer.commit(consumer.poll(3, 0)))
    timer.start()
    started = time.monotonic()
    producer.publish(episode("b", 2))
    assert time.monotonic() - started < 1.0
    timer.join()
    assert producer.counts.published == 5


def test_threads_publishing_at_once_lose_nothing(url):
    producer = open_producer(url, BufferOptions(max_pending=50, publish_timeout_s=5.0))
    consumer = open_consumer(url, "g", "c")

    def work(worker: int) -> None:
        for e in range(10):
            producer.publish(episode(f"w{worker}e{e}", 8))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    seen: dict[str, list[int]] = {}
    deadline = time.monotonic() + 10
    total = 0
    while total < 320 and time.monotonic() < deadline:
        batch = consumer.poll(16, 0.2)
        for d in batch:
            seen.setdefault(d.step.stream, []).append(d.step.position)
        total += len(batch)
        consumer.commit(batch)
    for t in threads:
        t.join()
    assert total == 320
    assert all(steps == list(range(8)) for steps in seen.values())
    assert producer.counts.published == 320


def test_a_batch_larger_than_max_pending_is_refused_at_once(url):
    producer = open_producer(url, BufferOptions(max_pending=2, publish_timeout_s=5.0))
    started = time.monotonic()
    with pytest.raises(BufferFull, match="raise max_pending"):
        producer.publish(episode("a", 3))
    assert time.monotonic() - started < 1.0


def test_closed_consumer_refuses_to_poll(url):
    consumer = open_consumer(url, "g", "c")
    consumer.close()
    consumer.close()
    with pytest.raises(RuntimeError, match="open a new one"):
        consumer.poll(1, 0)


@pytest.mark.parametrize("bad", ["memory://", "memory:///"])
def test_a_nameless_url_is_refused(bad):
    with pytest.raises(ConfigError, match="memory://NAME"):
        open_producer(bad)
