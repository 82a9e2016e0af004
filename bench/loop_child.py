"""The measuring processes of the ``loop`` scenario (bench/loop.py starts them pinned to the
load core); each prints one JSON line on stdout.

    python -m bench.loop_child worker --url URL --num-envs N --seconds S --warmup W
    python -m bench.loop_child buffer|producer|consumer --url URL [--rate R --batch B
        --seconds S --warmup W --burst T]

``worker``: one :class:`loop.collect.RolloutWorker` (CartPole-v1, ``num_envs`` envs, sampled
actions with log-probs and values, no seed) publishing into a ``memory://`` buffer in this
process, which a drain thread empties (poll up to 4096 records, commit them): the
co-located layout's in-process queue. After ``warmup`` seconds of the same loop, ``seconds``
are measured: env steps and predict requests over that time, and the duration of every
predict call as the worker made it (the HTTP round trip, JSON encoding and decoding
included; retries too, had there been any).

``buffer`` (producer and consumer as two threads of one process: what ``memory://`` needs),
or ``producer`` and ``consumer`` as two processes (bench/loop.py starts both; the consumer
says ``ready`` once it has the first batch, the producer then goes on when given a line on
stdin, and the consumer stops once it has the record count it is given on stdin). The
producer publishes batches of ``batch`` CartPole-shaped steps (one per "env", each env's
episode numbered in order) at ``rate`` steps/s, stamping each batch's ``served_at`` with
the wall clock right before ``publish`` and its phase in ``model_version``: one batch
first (a Kafka consumer joins its group), ``warmup`` seconds, ``seconds`` measured, a
pause, then back to back for ``burst`` seconds (``max_pending`` bounds the backlog). The
consumer polls (up to 4096 records, waiting up to 1 s) and commits after each poll, like a
trainer, dropping redeliveries by key. A measured record's latency is the wall clock when
the poll that delivered it returned minus its ``served_at``; the burst's throughput is its
records / (its first stamp to the return of the poll delivering its last record).
"""

from __future__ import annotations

import argparse
import select
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import orjson

from bench.children import percentile_ms
from client import Prediction
from loop.buffers import open_consumer, open_producer
from loop.buffers.base import Consumer, Producer
from loop.collect import RolloutWorker
from loop.experience import Step

ENV_ID = "CartPole-v1"
POLL_RECORDS = 4096
POLL_TIMEOUT_S = 1.0
JOIN_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 60.0
EPISODE_STEPS = 200  # the buffer producer ends each synthetic episode after this many steps


# --- worker -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerResult:
    num_envs: int
    seconds: float
    env_steps: int
    requests: int
    episodes: int
    predict_p50_ms: float
    predict_p99_ms: float
    predict_max_ms: float
    predict_share: float  # of the measured time, waiting for the server
    env_share: float  # stepping the envs
    publish_share: float  # publishing into the buffer
    drained: int  # records the drain thread committed, warm-up included
    published: int  # records the worker published, warm-up included
    all_requests: int  # predict requests answered, warm-up included
    retries: int

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.seconds if self.seconds else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


class TimedWorker(RolloutWorker):
    """A rollout worker that keeps the duration of each predict call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.predict_seconds: list[float] = []

    def _predict(self, observations: np.ndarray, seed: int | None) -> Prediction | None:
        started = time.perf_counter()
        try:
            return super()._predict(observations, seed)
        finally:
            self.predict_seconds.append(time.perf_counter() - started)


class Drain(threading.Thread):
    """Empties a buffer: poll, commit, count, until stopped and nothing is left."""

    def __init__(self, consumer: Consumer) -> None:
        super().__init__(name="drain", daemon=True)
        self.consumer = consumer
        self.stopping = threading.Event()
        self.committed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while True:
                deliveries = self.consumer.poll(POLL_RECORDS, 0.05)
                if deliveries:
                    self.consumer.commit(deliveries)
                    self.committed += len(deliveries)
                elif self.stopping.is_set():
                    return
        except BaseException as error:  # reported by the main thread
            self.error = error


def worker(
    url: str, num_envs: int, seconds: float, warmup: float, lane: str | None = None
) -> WorkerResult:
    buffer = f"memory://bench-loop-{num_envs}"
    consumer = open_consumer(buffer, "trainer", "drain")
    drain = Drain(consumer)
    drain.start()
    rollout = TimedWorker(ENV_ID, url, buffer, num_envs=num_envs, retry_for_s=10.0, lane=lane)
    with rollout:
        _run_for(rollout, warmup)
        before = _snapshot(rollout)
        rollout.predict_seconds.clear()
        _run_for(rollout, seconds)
        after = _snapshot(rollout)
        times = rollout.predict_seconds
        counters = rollout.counters
    drain.stopping.set()
    drain.join(DRAIN_TIMEOUT_S)
    consumer.close()
    if drain.error is not None:
        raise RuntimeError(f"the drain thread failed: {drain.error!r}") from drain.error
    elapsed = after["elapsed"] - before["elapsed"]

    def share(key: str) -> float:
        return (after[key] - before[key]) / elapsed if elapsed else 0.0

    return WorkerResult(
        num_envs=num_envs,
        seconds=elapsed,
        env_steps=int(after["steps"] - before["steps"]),
        requests=int(after["requests"] - before["requests"]),
        episodes=int(after["episodes"] - before["episodes"]),
        predict_p50_ms=percentile_ms(times, 50),
        predict_p99_ms=percentile_ms(times, 99),
        predict_max_ms=max(times, default=0.0) * 1e3,
        predict_share=share("predict"),
        env_share=share("env"),
        publish_share=share("publish"),
        drained=drain.committed,
        published=counters.published,
        all_requests=counters.requests,
        retries=counters.retries,
    )


def _run_for(rollout: RolloutWorker, seconds: float) -> None:
    end = time.monotonic() + seconds
    rollout.run(until=lambda _: time.monotonic() >= end)


def _snapshot(rollout: RolloutWorker) -> dict[str, float]:
    c = rollout.counters
    return {
        "elapsed": c.elapsed_s,
        "steps": c.env_steps,
        "requests": c.requests,
        "episodes": c.episodes,
        "predict": c.predict_s,
        "env": c.env_s,
        "publish": c.publish_s,
    }


# --- buffer -------------------------------------------------------------------------------

# The phase a record was published in, carried in its model_version.
JOIN, WARMUP, MEASURED, BURST = 0, 1, 2, 3
PAUSE_S = 0.5  # between the measured window and the burst: the consumer catches up
READY = "ready"  # the consumer's line once it has the first batch (it has joined)


@dataclass
class BufferResult:
    rate: float  # the asked steps/s
    batch: int
    seconds: float  # the measured window
    processes: int  # 1: producer and consumer are threads of one process; 2: processes
    published: int = 0  # records published in the window
    consumed: int = 0  # of those, delivered to the consumer
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    latency_max_ms: float = 0.0
    publish_p50_ms: float = 0.0  # the producer's publish call, in the window
    publish_p99_ms: float = 0.0
    burst_published: int = 0
    burst_consumed: int = 0
    burst_seconds: float = 0.0  # first publish to last delivery
    burst_publish_s: float = 0.0  # first publish to last publish returning
    duplicates: int = 0  # deliveries of a record already delivered
    notes: list[str] = field(default_factory=list)

    @property
    def achieved_rate(self) -> float:
        return self.published / self.seconds if self.seconds else 0.0

    @property
    def burst_per_s(self) -> float:
        return self.burst_consumed / self.burst_seconds if self.burst_seconds else 0.0


class Steps:
    """Batches of CartPole-shaped steps from ``batch`` envs, each env's episode in order."""

    def __init__(self, batch: int, name: str) -> None:
        self.batch, self.name = batch, name
        self.rng = np.random.default_rng(0)
        self.episode = [0] * batch
        self.step = [0] * batch

    def next(self, phase: int) -> list[Step]:
        """The next batch, its phase in ``model_version``, ``served_at`` not yet stamped."""
        steps = []
        observations = self.rng.standard_normal((self.batch, 4)).astype(np.float32)
        for env in range(self.batch):
            ends = self.step[env] == EPISODE_STEPS - 1
            steps.append(
                Step(
                    episode_id=f"{self.name}-{env}-{self.episode[env]}",
                    step=self.step[env],
                    observation=observations[env],
                    action=np.array(env % 2, np.int64),
                    log_prob=-0.69,
                    value=1.0,
                    reward=1.0,
                    terminated=False,
                    truncated=ends,
                    model_version=phase,
                    served_at=0.0,
                )
            )
            self.step[env] = 0 if ends else self.step[env] + 1
            self.episode[env] += ends
        return steps


def publish(producer: Producer, steps: list[Step]) -> tuple[float, float]:
    """Stamp ``served_at`` with the wall clock (the batch is built: its maker may set a
    frozen field), publish; the stamp and the publish call's seconds."""
    now = time.time()
    for step in steps:
        object.__setattr__(step, "served_at", now)
    started = time.perf_counter()
    producer.publish(steps)
    return now, time.perf_counter() - started


@dataclass
class Produced:
    """What the producer did after the first batch."""

    total: int = 0  # records, the first batch included
    measured: int = 0
    publish_s: list[float] = field(default_factory=list)  # measured publish calls
    burst: int = 0
    burst_first: float = 0.0  # wall clock of the burst's first stamp
    burst_end: float = 0.0  # ... and when its last publish returned


def produce(
    producer: Producer, steps: Steps, rate: float, warmup: float, seconds: float, burst: float
) -> Produced:
    """Warm-up and measured window at ``rate`` steps/s, a pause, then back to back for
    ``burst`` seconds; flushed. The first batch was published before (``total`` counts it)."""
    done = Produced(total=steps.batch)
    interval = steps.batch / rate
    next_at = time.monotonic()
    for phase, length in ((WARMUP, warmup), (MEASURED, seconds)):
        for _ in range(round(length / interval)):
            if (wait := next_at - time.monotonic()) > 0:
                time.sleep(wait)
            _, took = publish(producer, steps.next(phase))
            done.total += steps.batch
            if phase == MEASURED:
                done.measured += steps.batch
                done.publish_s.append(took)
            next_at += interval
    producer.flush()
    time.sleep(PAUSE_S)
    end = time.monotonic() + burst
    while time.monotonic() < end:
        at, took = publish(producer, steps.next(BURST))
        done.burst_first = done.burst_first or at
        done.burst_end = at + took
        done.total += steps.batch
        done.burst += steps.batch
    producer.flush()
    return done


@dataclass
class Tally:
    """What the consumer saw: fresh records by phase, redeliveries dropped by key."""

    delivered: int = 0  # fresh records, every phase
    latencies: list[float] = field(default_factory=list)  # MEASURED records, seconds
    burst: int = 0
    burst_last: float = 0.0  # when the poll that delivered the burst's last record returned
    duplicates: int = 0
    seen: set[str] = field(default_factory=set)

    def poll(self, consumer: Consumer, timeout_s: float = POLL_TIMEOUT_S) -> None:
        """One poll, like a trainer's: count its fresh records, then commit them all."""
        deliveries = consumer.poll(POLL_RECORDS, timeout_s)
        now = time.time()
        for delivery in deliveries:
            step = delivery.step
            if step.key in self.seen:
                self.duplicates += 1
                continue
            self.seen.add(step.key)
            self.delivered += 1
            if step.model_version == MEASURED:
                self.latencies.append(now - step.served_at)
            elif step.model_version == BURST:
                self.burst += 1
                self.burst_last = now
        if deliveries:
            consumer.commit(deliveries)


def result(
    rate: float, batch: int, seconds: float, processes: int, done: Produced, tally: Tally
) -> BufferResult:
    lat, calls = tally.latencies, done.publish_s
    out = BufferResult(
        rate, batch, seconds, processes,
        published=done.measured,
        consumed=len(lat),
        latency_p50_ms=percentile_ms(lat, 50),
        latency_p99_ms=percentile_ms(lat, 99),
        latency_max_ms=max(lat, default=0.0) * 1e3,
        publish_p50_ms=percentile_ms(calls, 50),
        publish_p99_ms=percentile_ms(calls, 99),
        burst_published=done.burst,
        burst_consumed=tally.burst,
        burst_seconds=max(0.0, tally.burst_last - done.burst_first) if tally.burst else 0.0,
        burst_publish_s=max(0.0, done.burst_end - done.burst_first),
        duplicates=tally.duplicates,
    )  # fmt: skip
    if tally.delivered < done.total:
        out.notes.append(
            f"{done.total - tally.delivered} of {done.total} records not delivered within "
            f"{DRAIN_TIMEOUT_S:g} s"
        )
    return out


def _join(consumer: Consumer, tally: Tally, batch: int) -> None:
    """Poll until the first batch is in (a Kafka consumer joins its group meanwhile)."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while tally.delivered < batch:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the consumer got {tally.delivered} of {batch} records in {JOIN_TIMEOUT_S:g} s"
            )
        tally.poll(consumer)


def threads(
    url: str, rate: float, batch: int, seconds: float, warmup: float, burst: float
) -> BufferResult:
    """Producer and consumer as two threads of this process (memory:// needs that)."""
    producer = open_producer(url)
    consumer = open_consumer(url, "bench", "trainer")
    tally = Tally()
    try:
        steps = Steps(batch, "bench")
        publish(producer, steps.next(JOIN))
        producer.flush()
        _join(consumer, tally, batch)
        box: list[Produced | BaseException] = []

        def run() -> None:
            try:
                box.append(produce(producer, steps, rate, warmup, seconds, burst))
            except BaseException as error:  # reported below
                box.append(error)

        thread = threading.Thread(target=run, name="producer", daemon=True)
        thread.start()
        deadline = None
        while True:
            if not thread.is_alive():
                if isinstance(box[0], BaseException):
                    raise RuntimeError(f"the producer failed: {box[0]!r}") from box[0]
                if tally.delivered >= box[0].total:
                    break
                deadline = deadline or time.monotonic() + DRAIN_TIMEOUT_S
                if time.monotonic() > deadline:
                    break
            tally.poll(consumer)
        assert isinstance(box[0], Produced)
        return result(rate, batch, seconds, 1, box[0], tally)
    finally:
        consumer.close()
        producer.close()


def producer_process(
    url: str, rate: float, batch: int, seconds: float, warmup: float, burst: float
) -> Produced:
    """The producer on its own: the first batch, then waits for a line on stdin (the
    consumer has it), then :func:`produce`."""
    producer = open_producer(url)
    try:
        steps = Steps(batch, "bench")
        publish(producer, steps.next(JOIN))
        producer.flush()
        if not sys.stdin.readline():
            raise RuntimeError("stdin closed before the consumer joined")
        return produce(producer, steps, rate, warmup, seconds, burst)
    finally:
        producer.close()


def consumer_process(url: str, batch: int) -> Tally:
    """The consumer on its own: says READY on stdout once it has the first batch, polls
    until it has the number of records it is then given on stdin (or DRAIN_TIMEOUT_S
    after that)."""
    consumer = open_consumer(url, "bench", "trainer")
    tally = Tally()
    try:
        _join(consumer, tally, batch)
        sys.stdout.write(READY + "\n")
        sys.stdout.flush()
        total, deadline = None, None
        while total is None or tally.delivered < total:
            if total is None and select.select([sys.stdin], [], [], 0)[0]:
                total = int(sys.stdin.readline() or 0)
                deadline = time.monotonic() + DRAIN_TIMEOUT_S
            if deadline is not None and time.monotonic() > deadline:
                break
            tally.poll(consumer, 0.1 if total is None else POLL_TIMEOUT_S)
        return tally
    finally:
        consumer.close()


# --- command line ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loop_child", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    w = commands.add_parser("worker")
    w.add_argument("--url", required=True)
    w.add_argument("--num-envs", type=int, required=True)
    w.add_argument("--seconds", type=float, default=8.0)
    w.add_argument("--warmup", type=float, default=1.0)
    w.add_argument("--lane", default=None, help="the server's local-lane socket (rlserve --lane)")
    for name in ("buffer", "producer", "consumer"):
        b = commands.add_parser(name)
        b.add_argument("--url", required=True)
        b.add_argument("--rate", type=float, default=2000.0)
        b.add_argument("--batch", type=int, default=64)
        b.add_argument("--seconds", type=float, default=8.0)
        b.add_argument("--warmup", type=float, default=1.0)
        b.add_argument("--burst", type=float, default=3.0)
    args = parser.parse_args(argv)
    out: dict[str, Any]
    if args.command == "worker":
        out = asdict(worker(args.url, args.num_envs, args.seconds, args.warmup, args.lane))
    elif args.command == "consumer":
        tally = consumer_process(args.url, args.batch)
        tally.seen.clear()
        out = {k: v for k, v in asdict(tally).items() if k != "seen"}
    else:
        run = threads if args.command == "buffer" else producer_process
        out = asdict(run(args.url, args.rate, args.batch, args.seconds, args.warmup, args.burst))
    sys.stdout.write(orjson.dumps(out).decode() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
