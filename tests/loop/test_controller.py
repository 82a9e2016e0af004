"""The sync controller (loop/controller.py): staleness bounded from the records themselves,
fallbacks, deduplication, commit order, accounting, the forced-lag run and the metrics."""

from __future__ import annotations

import dataclasses
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any
from uuid import uuid4

import pytest
from prometheus_client import CollectorRegistry

from kernel.errors import ConfigError
from loop.buffers import memory, open_consumer, open_producer
from loop.buffers.base import (
    BufferFull,
    BufferOptions,
    Consumer,
    Delivery,
    Producer,
    ProducerCounts,
)
from loop.controller import Accounting, Batch, Fallback, LoopMetrics, SyncController
from loop.experience import Completion, Record, Step
from tests.loop.buffers.contract import make_completion, make_step, stepped
from tests.loop.buffers.test_local_log import append_frame

K = 5  # max_staleness in most tests


@pytest.fixture
def urls() -> Iterator[list[str]]:
    """Fresh memory:// names; call ``new()`` for each buffer a test needs."""
    made: list[str] = []
    yield made
    for url in made:
        memory.discard(url)


def new(urls: list[str]) -> str:
    url = f"memory://ctl-{uuid4().hex}"
    urls.append(url)
    return url


def spread(episodes: int = 30, length: int = 10) -> list[Step]:
    """Steps with versions spread over 0..20: each episode starts at its own version and
    moves up one version every third step (as across weight swaps)."""
    return [
        make_step(f"ep{e}", i, last=i == length - 1, version=min(20, e % 18 + i // 3))
        for e in range(episodes)
        for i in range(length)
    ]


def staleness_of(batch: Batch) -> list[int]:
    """From the records themselves, against the version the batch was returned at."""
    return [batch.version - s.model_version for s in batch.steps]


def drain_offline(consumer: Consumer) -> list[Step]:
    got: list[Step] = []
    while deliveries := consumer.poll(1000, 0):
        consumer.commit(deliveries)
        got.extend(stepped(d.step) for d in deliveries)
    return got


def run_trainer(
    controller: SyncController,
    *,
    size: int = 16,
    first_version: int = 20,  # spread()'s newest: no record is from the future
    offline: Consumer | None = None,
) -> tuple[list[Batch], list[tuple[int, list[Step]]]]:
    """Consume everything, publishing a new version after every batch. Returns the
    batches, and per call the version it ran under and what it routed offline."""
    controller.set_version(first_version)
    batches: list[Batch] = []
    routed: list[tuple[int, list[Step]]] = []
    while True:
        version = controller.version
        batch = controller.next_batch(size, timeout_s=0)
        if offline is not None:
            routed.append((version, drain_offline(offline)))
        if not batch.steps:  # the buffer is drained: a poll brought nothing
            return batches, routed
        batches.append(batch)
        controller.commit(batch)
        controller.set_version(controller.version + 1)


# -- the bound -------------------------------------------------------------------------


@pytest.mark.parametrize("fallback", [Fallback.DROP, Fallback.OFFLINE])
def test_no_over_stale_record_is_ever_returned(urls, fallback):
    url, offline_url = new(urls), new(urls)
    steps = spread()
    producer = open_producer(url)
    producer.publish(steps)
    offline = open_producer(offline_url) if fallback == Fallback.OFFLINE else None
    offline_consumer = open_consumer(offline_url, "dpo", "c")
    controller = SyncController(
        open_consumer(url, "trainer", "t"), max_staleness=K, fallback=fallback, offline=offline
    )
    batches, routed = run_trainer(controller, offline=offline_consumer)

    returned = [s for b in batches for s in b.steps]
    violations = [s.key for b in batches for s in b.steps if b.version - s.model_version > K]
    assert violations == []
    assert all(b.staleness == staleness_of(b) and not any(b.stale()) for b in batches)
    assert 0 < len(returned) < len(steps)  # both outcomes happened
    over = {s.key for s in steps} - {s.key for s in returned}
    books = controller.accounting()
    if fallback == Fallback.OFFLINE:
        # exactly the over-stale records, each over the bound when it was routed
        assert sorted(s.key for _, got in routed for s in got) == sorted(over)
        assert all(v - s.model_version > K for v, got in routed for s in got)
        assert books.routed_offline == len(over)
        assert books.dropped == 0
    else:
        assert books.dropped == len(over)
        assert books.routed_offline == 0
        assert drain_offline(offline_consumer) == []
    assert books.consumed == len(returned) == len({s.key for s in returned})
    assert books.balance(producer.counts.published, producer.pending()) == 0
    assert producer.pending() == 0
    assert books.held == books.undecided == 0
    assert books.committed == len(steps)


def test_the_version_is_checked_again_at_return(urls):
    """The trainer publishes while the controller polls for the rest of a batch: what
    went over the bound meanwhile is not returned (DROP) or is marked (KEEP)."""

    class Publishing:  # from its second poll on, the trainer moves on 3 versions per poll
        def __init__(self, inner: Consumer, controller: list[SyncController]) -> None:
            self.inner, self.counts, self.controller = inner, inner.counts, controller
            self.polls = 0

        def poll(self, max_records: int, timeout_s: float) -> list[Delivery]:
            self.polls += 1
            if self.polls > 1:
                self.controller[0].set_version(self.controller[0].version + 3)
            return self.inner.poll(max_records, timeout_s)

        def commit(self, deliveries: Sequence[Delivery]) -> None:
            self.inner.commit(deliveries)

        def close(self) -> None:
            self.inner.close()

    url = new(urls)
    fallbacks = (Fallback.DROP, Fallback.KEEP)
    consumers = {f: open_consumer(url, f"g-{f}", "t") for f in fallbacks}
    open_producer(url).publish([make_step("a", i, version=10) for i in range(6)])
    for fallback in fallbacks:
        ref: list[SyncController] = []
        consumer = Publishing(consumers[fallback], ref)
        ref.append(SyncController(consumer, max_staleness=K, fallback=fallback, version=13))
        controller = ref[0]
        # The six are 3 versions old when polled; the batch is not full, so the controller
        # polls again, during which the trainer publishes: 6 versions old at return.
        batch = controller.next_batch(10, timeout_s=0.05)
        assert consumer.polls == 2
        assert batch.version == 16
        if fallback == Fallback.DROP:
            assert batch.steps == []
            assert controller.accounting().dropped == 6
            assert controller.accounting().committed == 6
        else:
            assert len(batch) == 6
            assert batch.staleness == staleness_of(batch) == [6] * 6
            assert batch.stale() == [True] * 6
            assert controller.accounting().kept_stale == 6


def test_zero_violations_while_workers_and_the_trainer_run_in_threads(urls):
    """Workers publish from a thread with the newest version (or, one in three steps, an
    old one); the trainer publishes versions from another thread while the controller
    reads: no returned record is ever over the bound at its batch's version."""
    url = new(urls)
    producer = open_producer(url, BufferOptions(max_pending=500, publish_timeout_s=5.0))
    controller = SyncController(
        open_consumer(url, "trainer", "t"), max_staleness=2, fallback=Fallback.DROP
    )
    stop = threading.Event()

    def workers() -> None:
        for e in range(150):
            v = controller.version
            versions = [v if i % 3 else max(0, v - 4) for i in range(4)]
            producer.publish(
                [make_step(f"t{e}", i, last=i == 3, version=versions[i]) for i in range(4)]
            )

    def publisher() -> None:
        while not stop.wait(0.001):
            controller.set_version(controller.version + 1)

    threads = [threading.Thread(target=workers), threading.Thread(target=publisher)]
    for t in threads:
        t.start()
    violations, returned = [], 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        batch = controller.next_batch(32, timeout_s=0.02)
        violations += [s.key for s in batch.steps if batch.version - s.model_version > 2]
        returned += len(batch)
        controller.commit(batch)
        books = controller.accounting()
        if not threads[0].is_alive() and books.consumed + books.dropped == 600:
            break
    stop.set()
    for t in threads:
        t.join()
    assert violations == []
    books = controller.accounting()
    assert books.consumed == returned > 0
    assert books.dropped > 0
    assert books.balance(producer.counts.published, producer.pending()) == 0


def test_keep_returns_everything_marked_with_its_staleness(urls):
    url = new(urls)
    steps = spread()
    producer = open_producer(url)
    producer.publish(steps)
    controller = SyncController(
        open_consumer(url, "trainer", "t"), max_staleness=K, fallback=Fallback.KEEP
    )
    batches, _ = run_trainer(controller, size=100)
    returned = [s for b in batches for s in b.steps]
    assert sorted(s.key for s in returned) == sorted(s.key for s in steps)
    marked = 0
    for b in batches:
        assert b.staleness == staleness_of(b)
        assert b.stale() == [st > K for st in staleness_of(b)]
        marked += sum(b.stale())
    books = controller.accounting()
    assert 0 < marked < len(steps)
    assert books.kept_stale == marked
    assert (books.consumed, books.dropped, books.routed_offline) == (len(steps), 0, 0)
    assert books.balance(producer.counts.published, producer.pending()) == 0


def test_no_bound_returns_everything_unmarked(urls):
    url = new(urls)
    open_producer(url).publish(spread(5))
    controller = SyncController(
        open_consumer(url, "trainer", "t"), max_staleness=None, fallback=Fallback.DROP
    )
    batches, _ = run_trainer(controller, first_version=40)
    assert sum(len(b) for b in batches) == 50
    assert max(st for b in batches for st in b.staleness) >= 40
    assert not any(any(b.stale()) for b in batches)


# -- at least once -----------------------------------------------------------------------


def test_redeliveries_after_a_consumer_restart_are_dropped_and_counted(urls):
    url = new(urls)
    producer = open_producer(url)
    steps = [make_step(f"e{e}", i, last=i == 9, version=3) for e in range(3) for i in range(10)]
    producer.publish(steps)
    first = open_consumer(url, "trainer", "t")
    controller = SyncController(first, max_staleness=K, fallback=Fallback.DROP, version=3)
    held = controller.next_batch(20, timeout_s=0)  # used by the trainer, not yet committed
    assert len(held) == 20
    first.close()  # the consumer fails: its 20 uncommitted deliveries go back to the group

    controller.reopen(open_consumer(url, "trainer", "t"))
    rest = controller.next_batch(30, timeout_s=0)
    assert [s.key for s in rest.steps] == [s.key for s in steps[20:]]  # no record twice
    books = controller.accounting()
    assert books.duplicates == 20
    assert books.consumed == 30
    controller.commit(rest)
    # The redeliveries wait for the trainer's commit of the batch they duplicate (and the
    # rest, polled after them, waits for them).
    assert producer.pending() == 30
    assert books.balance(producer.counts.published, producer.pending()) == 0
    controller.commit(held)
    assert producer.pending() == 0
    books = controller.accounting()
    assert books.balance(producer.counts.published, producer.pending()) == 0
    assert books.committed == 20 + 10  # the redelivered copies, and the rest


def test_a_trainer_that_dies_before_commit_gets_its_batch_again(urls):
    url = new(urls)
    open_producer(url).publish([make_step("a", i, version=1) for i in range(8)])
    consumer = open_consumer(url, "trainer", "t")
    dead = SyncController(consumer, max_staleness=K, fallback=Fallback.DROP, version=1)
    lost = dead.next_batch(8, timeout_s=0)
    consumer.close()  # the trainer died holding the batch

    again = SyncController(
        open_consumer(url, "trainer", "t"), max_staleness=K, fallback=Fallback.DROP, version=1
    )
    assert [s.key for s in again.next_batch(8, timeout_s=0).steps] == [s.key for s in lost.steps]


def test_handled_records_never_commit_a_held_batch_on_a_cumulative_log(tmp_path):
    """file:// commits are offsets: committing a dropped record commits every record
    before it. The controller commits in poll order, so the batch the trainer still holds
    is not committed with the dropped records polled after it."""
    url = f"file://{tmp_path}/log"
    producer = open_producer(url)
    fresh = [make_step("fresh", i, version=10) for i in range(4)]
    stale = [make_step("stale", i, version=1) for i in range(4)]
    producer.publish(fresh + stale)
    producer.flush()
    consumer = open_consumer(url, "trainer", "t")
    controller = SyncController(consumer, max_staleness=K, fallback=Fallback.DROP, version=10)
    held = controller.next_batch(8, timeout_s=0)
    assert [s.key for s in held.steps] == [s.key for s in fresh]
    assert controller.accounting().dropped == 4
    assert controller.next_batch(8, timeout_s=0).steps == []  # nothing new: flushes, commits 0
    assert producer.pending() == 8
    consumer.close()  # the trainer dies before committing

    again = open_consumer(url, "trainer", "t")
    assert [d.step.key for d in again.poll(100, 0)] == [s.key for s in fresh + stale]
    again.close()

    survivor = SyncController(
        open_consumer(url, "trainer", "t"), max_staleness=K, fallback=Fallback.DROP, version=10
    )
    batch = survivor.next_batch(8, timeout_s=0)
    assert [s.key for s in batch.steps] == [s.key for s in fresh]
    survivor.commit(batch)
    assert producer.pending() == 0
    books = survivor.accounting()
    assert books.balance(producer.counts.published, producer.pending()) == 0
    producer.close()


def test_a_full_offline_buffer_loses_nothing(urls):
    url, offline_url = new(urls), new(urls)
    producer = open_producer(url)
    producer.publish([make_step("old", i, version=0) for i in range(6)])
    producer.publish([make_step("new", i, version=9) for i in range(4)])
    offline = open_producer(offline_url, BufferOptions(max_pending=6, publish_timeout_s=0))
    offline_consumer = open_consumer(offline_url, "dpo", "c")
    offline.publish([make_step("earlier", i, version=0) for i in range(4)])  # room for 2
    controller = SyncController(
        open_consumer(url, "trainer", "t"),
        max_staleness=K,
        fallback=Fallback.OFFLINE,
        offline=offline,
        version=9,
    )
    with pytest.raises(BufferFull):
        controller.next_batch(10, timeout_s=0)
    books = controller.accounting()
    assert (books.undecided, books.routed_offline, books.consumed, books.committed) == (
        10, 0, 0, 0,
    )  # fmt: skip
    assert books.balance(producer.counts.published, producer.pending()) == 0

    assert len(drain_offline(offline_consumer)) == 4  # the offline learner makes room
    batch = controller.next_batch(10, timeout_s=0)
    assert [s.key for s in batch.steps] == [f"new:{i}" for i in range(4)]
    assert [s.key for s in drain_offline(offline_consumer)] == [f"old:{i}" for i in range(6)]
    controller.commit(batch)
    books = controller.accounting()
    assert (books.routed_offline, books.consumed, books.undecided) == (6, 4, 0)
    assert producer.pending() == 0
    assert books.balance(producer.counts.published, producer.pending()) == 0


# -- the forced-lag run ------------------------------------------------------------------


def forced_lag(max_staleness: int | None, urls: list[str], rounds: int = 60) -> list[int]:
    """Four fast workers and one straggler publish 40 steps a round; a slow trainer takes
    16 a round and publishes a new version every 16 records it learns from. Fast workers
    act with the trainer's newest version, the straggler refreshes every 10 rounds.
    Returns the maximum staleness per round, from the returned records."""
    url = new(urls)
    producer = open_producer(url, BufferOptions(max_pending=1_000_000))
    controller = SyncController(
        open_consumer(url, "trainer", "t"), max_staleness=max_staleness, fallback=Fallback.DROP
    )
    straggler_version, learned = 0, 0
    per_round = []
    for r in range(rounds):
        if r % 10 == 0:
            straggler_version = controller.version
        for w in range(5):
            version = straggler_version if w == 4 else controller.version
            episode = [make_step(f"w{w}r{r}", i, last=i == 7, version=version) for i in range(8)]
            producer.publish(episode)
        batch = controller.next_batch(16, timeout_s=0)
        per_round.append(max(staleness_of(batch), default=0))
        controller.commit(batch)
        learned += len(batch)
        while learned >= 16:
            controller.set_version(controller.version + 1)
            learned -= 16
    books = controller.accounting()
    assert books.balance(producer.counts.published, producer.pending()) == 0
    assert books.consumed + books.dropped + producer.pending() == 40 * rounds
    return per_round


def test_forced_lag_unbounded_grows_bounded_stays_within_k(urls):
    unbounded = forced_lag(None, urls)
    bounded = forced_lag(K, urls)
    early, late = max(unbounded[:10]), max(unbounded[-10:])
    assert late > early + 2 * K  # the backlog makes learning staler and staler
    assert unbounded[-1] > 3 * K
    assert max(bounded) <= K  # zero violations, from the records themselves
    assert max(bounded[-10:]) >= K - 1  # and the bound is what limits it, not luck


# -- metrics -----------------------------------------------------------------------------


def sample(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    return 0.0 if value is None else value


def test_metrics_match_the_accounting(urls):
    url, offline_url = new(urls), new(urls)
    registry = CollectorRegistry()
    metrics = LoopMetrics(registry)
    producer = open_producer(url)
    now = time.time()
    steps = [dataclasses.replace(s, served_at=now) for s in spread(12)]
    producer.publish(steps)
    producer.publish(steps[:7])  # a producer's retry: duplicates
    consumer = open_consumer(url, "trainer", "t")
    controller = SyncController(
        consumer,
        max_staleness=K,
        fallback=Fallback.OFFLINE,
        offline=open_producer(offline_url),
        metrics=metrics,
        pending=producer.pending,
    )
    batches, _ = run_trainer(controller)
    books = controller.accounting()
    assert books.duplicates == 7
    assert books.balance(producer.counts.published, producer.pending(), extra=7) == 0
    assert sample(registry, "rl_experience_consumed_total") == books.consumed
    assert sample(registry, "rl_experience_routed_total") == books.routed_offline > 0
    assert sample(registry, "rl_experience_dropped_total") == books.dropped == 0
    assert sample(registry, "rl_experience_duplicates_total") == books.duplicates
    assert sample(registry, "rl_experience_kept_stale_total") == 0
    assert sample(registry, "rl_policy_version") == controller.version
    decided = books.consumed + books.routed_offline
    assert sample(registry, "rl_experience_staleness_count") == decided
    within = sum(st <= K for b in batches for st in b.staleness)
    assert registry.get_sample_value("rl_experience_staleness_bucket", {"le": "5.0"}) == within
    assert sample(registry, "rl_buffer_latency_seconds_count") == len(steps)
    assert 0 <= sample(registry, "rl_buffer_latency_seconds_sum") < 60 * len(steps)
    assert controller.lag() == 0
    assert sample(registry, "rl_buffer_pending") == 0
    metrics.busy(0.85)
    assert sample(registry, "rl_trainer_busy_ratio") == 0.85
    with pytest.raises(ValueError, match=r"0\.\.1"):
        metrics.busy(1.5)


def test_metrics_endpoint_serves_the_registry():
    metrics = LoopMetrics()
    port = metrics.serve_metrics(0, "127.0.0.1")
    metrics.policy_version.set(7)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert "rl_policy_version 7.0" in text
    assert "rl_experience_staleness_bucket" in text


# -- configuration and small things --------------------------------------------------------


def test_reference_sync_policy_maps_onto_the_controller(urls):
    sync_policy: dict[str, Any] = {"max_staleness": 100, "fallback_strategy": "offline"}
    controller = SyncController(
        open_consumer(new(urls), "trainer", "t"),
        max_staleness=sync_policy["max_staleness"],
        fallback=sync_policy["fallback_strategy"],  # a string or a Fallback
        offline=open_producer(new(urls)),
    )
    assert (controller.max_staleness, controller.fallback) == (100, Fallback.OFFLINE)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_staleness": 3, "fallback": Fallback.OFFLINE}, "offline buffer"),
        ({"max_staleness": -1, "fallback": Fallback.DROP}, ">= 0"),
        ({"max_staleness": 3, "fallback": "sometimes"}, "drop, offline, keep"),
    ],
)
def test_bad_policies_are_refused(urls, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SyncController(open_consumer(new(urls), "trainer", "t"), **kwargs)


def test_versions_only_move_forward_and_an_idle_buffer_gives_an_empty_batch(urls):
    controller = SyncController(
        open_consumer(new(urls), "trainer", "t"), max_staleness=K, fallback=Fallback.DROP
    )
    controller.set_version(4)
    with pytest.raises(ValueError, match="only move forward"):
        controller.set_version(3)
    started = time.monotonic()
    assert controller.next_batch(8, timeout_s=0.05).steps == []
    assert time.monotonic() - started < 1.0
    assert controller.lag() is None
    assert controller.accounting() == Accounting()


def test_a_producer_protocol_is_enough_for_offline(urls):
    """Any Producer works as the offline buffer (here a list)."""

    class Listing:
        def __init__(self) -> None:
            self.steps: list[Record] = []
            self.flushes = 0
            self.counts = ProducerCounts()

        def publish(self, steps: Sequence[Record]) -> None:
            self.steps.extend(steps)

        def pending(self) -> int:
            return 0

        def flush(self, timeout_s: float = 10.0) -> None:
            self.flushes += 1

        def close(self) -> None:
            pass

    url = new(urls)
    open_producer(url).publish([make_step("x", i, version=0) for i in range(3)])
    listing = Listing()
    offline: Producer = listing
    controller = SyncController(
        open_consumer(url, "trainer", "t"),
        max_staleness=K,
        fallback=Fallback.OFFLINE,
        offline=offline,
        version=K + 1,
    )
    assert controller.next_batch(3, timeout_s=0).steps == []
    assert [s.key for s in listing.steps] == ["x:0", "x:1", "x:2"]
    assert listing.flushes == 1  # stored before the commit
    assert controller.accounting().committed == 3


def test_a_controller_returns_the_records_it_learns_from_and_refuses_another_kind(urls):
    url = new(urls)
    group = [make_completion("g", i, size=4) for i in range(4)]
    open_producer(url).publish(group)
    controller = SyncController[Completion](
        open_consumer(url, "grpo", "t"),
        max_staleness=K,
        fallback="drop",
        records=Completion,
        version=1,
    )
    batch = controller.next_batch(4, timeout_s=1)
    assert [c.key for c in batch.steps] == [c.key for c in group]
    controller.commit(batch)
    steps = new(urls)
    open_producer(steps).publish([make_completion("h", 0)])
    ppo = SyncController(
        open_consumer(steps, "ppo", "t"), max_staleness=K, fallback="drop", version=1
    )
    with pytest.raises(ConfigError, match=r"delivered a Completion record .* learns from Step"):
        ppo.next_batch(1, timeout_s=1)


def test_poison_records_are_counted_and_the_trainer_learns_through_them(tmp_path):
    """One poison record in every ten on a file buffer: every good record reaches the
    trainer, the poison ones are counted in rl_experience_undecodable_total, and nothing
    stays pending."""
    url = f"file://{tmp_path}/log"
    producer = open_producer(url)
    steps = spread(6)
    for start in range(0, len(steps), 10):
        producer.publish(steps[start : start + 10])
        append_frame(tmp_path / "log", b"\xc1")  # msgpack's one never-used byte
    registry = CollectorRegistry()
    controller = SyncController(
        open_consumer(url, "trainer", "t"),
        max_staleness=None,
        fallback=Fallback.KEEP,
        metrics=LoopMetrics(registry),
    )
    batches, _ = run_trainer(controller)
    assert sorted(s.key for b in batches for s in b.steps) == sorted(s.key for s in steps)
    assert sample(registry, "rl_experience_undecodable_total") == len(steps) // 10
    assert controller.accounting().balance(producer.counts.published, producer.pending()) == 0


@pytest.mark.parametrize("fallback", [Fallback.DROP, Fallback.KEEP])
def test_records_from_the_future_are_counted_and_dropped(urls, fallback):
    """Records stamped with versions the trainer has not published (10**6, 2**62 with the
    trainer at 5) never reach it, whatever the bound; the books still balance."""
    url = new(urls)
    producer = open_producer(url)
    good = [make_step("good", i, version=5 - i % 3) for i in range(6)]
    forged = [make_step("forged", 0, version=10**6), make_step("forged", 1, version=2**62)]
    producer.publish([*good[:3], *forged, *good[3:]])
    registry = CollectorRegistry()
    controller = SyncController(
        open_consumer(url, "trainer", "t"),
        max_staleness=None if fallback == Fallback.KEEP else K,
        fallback=fallback,
        metrics=LoopMetrics(registry),
        version=5,
    )
    batch = controller.next_batch(16, timeout_s=0)
    assert [s.key for s in batch.steps] == [s.key for s in good]
    assert min(batch.staleness) >= 0
    controller.commit(batch)
    books = controller.accounting()
    assert books.from_future == 2
    assert sample(registry, "rl_experience_from_future_total") == 2
    assert books.balance(producer.counts.published, producer.pending()) == 0
