"""How a batch is formed: a pure function of the queue, the clock and the batching policy.

The dynamic batcher (``serve.dataplane.dynamic_batcher``) asks :func:`plan` what to do with
its queue each time something changes, and does it. Nothing here touches asyncio or
onnxruntime, so the policy is tested with plain numbers.

The rules, in order:

1. Requests whose deadline has passed are *expired*: answered 504 and never executed.
2. Rows are gathered from the head of the queue (first come, first served, never
   reordered) up to ``max_batch_size`` rows, all for the version the head runs on: a
   batch never mixes model versions.
3. The batch is released at once when it is full, when the next request does not fit,
   when ``max_wait_s`` has passed since the oldest request arrived, or when waiting any
   longer would make some gathered request miss its deadline given the expected run time.
4. Otherwise the batcher waits until the earliest of those moments, or a new arrival.
5. The released batch is padded to the smallest warmed bucket that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    """What the policy needs to know about one queued request."""

    rows: int
    enqueued_at: float  # monotonic seconds
    deadline: float  # monotonic seconds
    version: int = 0  # the model version this request runs on


@dataclass(frozen=True)
class Policy:
    max_batch_size: int
    max_wait_s: float
    buckets: tuple[int, ...]  # warmed batch sizes, ascending; the last is max_batch_size


@dataclass(frozen=True)
class Plan:
    expired: tuple[int, ...]  # queue indices to answer 504 without running
    take: tuple[int, ...]  # queue indices to run now, in order; empty means wait
    padded_rows: int  # the bucket the taken rows are padded to (0 when waiting)
    wait_s: float  # when take is empty: how long to wait before planning again


def buckets_for(max_batch_size: int) -> tuple[int, ...]:
    """Powers of two below max_batch_size, and max_batch_size itself."""
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if (1 << i) < max_batch_size]
    return (*sizes, max_batch_size)


def bucket(rows: int, buckets: Sequence[int]) -> int:
    return next(b for b in buckets if b >= rows)


def plan(queue: Sequence[Waiting], now: float, policy: Policy, expected_run_s: float) -> Plan:
    expired = tuple(i for i, w in enumerate(queue) if w.deadline <= now)
    live = [i for i, w in enumerate(queue) if w.deadline > now]
    take, rows = _gather(queue, live, policy.max_batch_size)
    if not take:
        return Plan(expired, (), 0, wait_s=0.0)
    release_at = _release_time(queue, take, live, rows, policy, expected_run_s)
    if release_at <= now:
        return Plan(expired, tuple(take), bucket(rows, policy.buckets), wait_s=0.0)
    return Plan(expired, (), 0, wait_s=release_at - now)


def _gather(queue: Sequence[Waiting], live: list[int], limit: int) -> tuple[list[int], int]:
    take: list[int] = []
    rows = 0
    for i in live:
        if rows + queue[i].rows > limit or queue[i].version != queue[live[0]].version:
            break
        take.append(i)
        rows += queue[i].rows
    return take, rows


def _release_time(
    queue: Sequence[Waiting],
    take: list[int],
    live: list[int],
    rows: int,
    policy: Policy,
    expected_run_s: float,
) -> float:
    """The moment the gathered batch must go; in the past or now means release at once."""
    blocked = len(take) < len(live)  # the next request cannot join: nothing more can
    if rows >= policy.max_batch_size or blocked:
        return float("-inf")
    oldest = min(queue[i].enqueued_at for i in take)
    tightest = min(queue[i].deadline for i in take)
    return min(oldest + policy.max_wait_s, tightest - expected_run_s)
