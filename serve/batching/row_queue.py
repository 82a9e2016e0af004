"""The queue of pending rows: a model's admitted requests, first come first served.

The dynamic batch scheduler (``serve.batching.dynamic_batcher``) queues each admitted
request as a :class:`Ticket` and counts the queue in rows, the unit of its limits
(``max_queue_rows``, ``max_batch_size``). The head of the queue is what
``serve.batching.plan.plan`` looks at; what it takes or expires leaves from there, and
the rest keeps its order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from serve.dataplane.messages import InferenceResponse, Prepared


@dataclass(slots=True, eq=False)
class Ticket:
    prepared: Prepared
    enqueued_at: float
    version: int | None  # pinned; None runs on whichever version is active at batch time
    future: asyncio.Future[InferenceResponse] = field(repr=False)


class RowQueue:
    """Admitted requests not yet running, in arrival order, and their rows."""

    def __init__(self) -> None:
        self._tickets: deque[Ticket] = deque()
        self.rows = 0  # every queued request's rows

    def __len__(self) -> int:
        return len(self._tickets)

    def __bool__(self) -> bool:
        return bool(self._tickets)

    def __iter__(self) -> Iterator[Ticket]:
        return iter(self._tickets)

    def append(self, ticket: Ticket) -> None:
        self._tickets.append(ticket)
        self.rows += ticket.prepared.rows

    def window(self, max_rows: int) -> list[Ticket]:
        """The head: every request that could join the next batch of ``max_rows``, and one more."""
        window: list[Ticket] = []
        rows = 0
        for ticket in self._tickets:
            window.append(ticket)
            rows += ticket.prepared.rows
            if rows > max_rows:
                break
        return window

    def pop(
        self, window: list[Ticket], expired: tuple[int, ...], take: tuple[int, ...]
    ) -> tuple[list[Ticket], list[Ticket]]:
        """Remove these positions of ``window`` (the head) from the queue, each given in
        ascending order: the expired requests and the batch; the rest of the window stays
        at the head."""
        if not expired and (not take or take[-1] == len(take) - 1):  # the batch is the head
            batch = [self._tickets.popleft() for _ in take]
            self.rows -= sum([t.prepared.rows for t in batch])
            return [], batch
        chosen = {*expired, *take}
        kept = [t for i, t in enumerate(window) if i not in chosen]
        for _ in window:
            self._tickets.popleft()
        self._tickets.extendleft(reversed(kept))
        popped = ([window[i] for i in expired], [window[i] for i in take])
        self.rows -= sum(t.prepared.rows for group in popped for t in group)
        return popped

    def drop_settled(self) -> None:
        """Forget the requests at the head whose caller already has an answer (their deadline)."""
        while self._tickets and self._tickets[0].future.done():
            self.rows -= self._tickets.popleft().prepared.rows

    def expire(self, now: float) -> list[Ticket]:
        """Remove every request answered already or due by ``now``; the latter are returned,
        to be answered."""
        kept: deque[Ticket] = deque()
        due: list[Ticket] = []
        for ticket in self._tickets:
            if ticket.future.done():
                self.rows -= ticket.prepared.rows
            elif ticket.prepared.deadline <= now:
                self.rows -= ticket.prepared.rows
                due.append(ticket)
            else:
                kept.append(ticket)
        self._tickets = kept
        return due

    def pin(self, version: int) -> None:
        """Requests queued without a version run on ``version``."""
        for ticket in self._tickets:
            if ticket.version is None:
                ticket.version = version

    def pinned(self) -> set[int]:
        return {t.version for t in self._tickets if t.version is not None}
