"""Which waiting requests join the decoding batch at the next step: a pure function of the
queue, the batch's occupancy, the clock and the limits (in tokens and sequences).

The continuous-batching scheduler asks :func:`plan_step` at every step boundary of its
decoding thread (``serve.lm.scheduling.handover``, under its lock) and does what it says.
Nothing here touches threads, asyncio or onnxruntime, so the rules are tested with plain
numbers.

The rules, in order:

1. Requests whose deadline has passed are *expired*: they leave the queue, never run, and
   are answered 504 (by the event loop's deadline sweep).
2. The others join in arrival order (never reordered: a large request at the head waits
   for room rather than being overtaken for ever) while all of these hold with it:

   - ``max_sequences``: sequences decoding at once (a scoring request holds none: it is
     one forward pass and leaves at the same boundary);
   - ``max_batch_tokens``: the key/value cache the batch may come to hold, *padded*: a
     batch's cache is one row per sequence, every row as long as its longest, so it is
     counted as the sequences times the longest reservation among them (a sequence
     reserves its prompt plus its ``max_new_tokens``). A batch admitted never outgrows the
     budget, however its rows grow;
   - ``max_prefill_tokens``: tokens prefilled at one boundary, which is how long the
     running sequences wait for their next token while newcomers join. A generation whose
     prompt another joining at the same boundary has (a group's choices) counts none: the
     batch prefills that prompt once for all of them.

3. Progress: the first newcomer at a boundary is never held back by
   ``max_prefill_tokens``, and when nothing is running the head of the queue joins
   whatever its size (it runs alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Occupancy", "StepLimits", "StepPlan", "Waiting", "plan_step"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the rules need to know about one queued request."""

    prefill_tokens: int  # tokens its first graph call processes
    reserve_tokens: int  # its cache row's longest length while decoding (0: it never stays)
    sequences: int  # sequences it adds to the batch (1 to generate, 0 to score)
    deadline: float  # monotonic seconds
    prompt: int | None = None  # its prompt's key: one prefill serves a boundary's equal ones


@dataclass(frozen=True, slots=True)
class Occupancy:
    """The running batch (every version's together)."""

    sequences: int
    longest_reserve: int  # the largest reserve_tokens among them (0: none running)

    @property
    def padded_tokens(self) -> int:
        """The cache the batch may come to hold: every row as long as the longest."""
        return self.sequences * self.longest_reserve


@dataclass(frozen=True, slots=True)
class StepLimits:
    max_sequences: int
    max_batch_tokens: int
    max_prefill_tokens: int


@dataclass(frozen=True, slots=True)
class StepPlan:
    expired: tuple[int, ...]  # queue indices to answer 504 without running
    join: tuple[int, ...]  # queue indices to run now, in order


def plan_step(
    queue: Sequence[Waiting], running: Occupancy, now: float, limits: StepLimits
) -> StepPlan:
    expired = tuple(i for i, w in enumerate(queue) if w.deadline <= now)
    join: list[int] = []
    sequences, longest, prefill = running.sequences, running.longest_reserve, 0
    prefilled: set[int] = set()  # prompts prefilled at this boundary already
    for index, waiting in enumerate(queue):
        if waiting.deadline <= now:
            continue
        shared = waiting.prompt is not None and waiting.prompt in prefilled
        tokens = 0 if shared else waiting.prefill_tokens
        alone = not join and sequences == 0
        after = Occupancy(
            sequences + waiting.sequences, max(longest, waiting.reserve_tokens)
        )  # the batch with it (a scoring adds no row)
        fits = (
            after.sequences <= limits.max_sequences
            and (not waiting.sequences or after.padded_tokens <= limits.max_batch_tokens)
            and (not join or prefill + tokens <= limits.max_prefill_tokens)
        )
        if not (fits or alone):
            break
        join.append(index)
        if waiting.sequences:
            sequences, longest = after.sequences, after.longest_reserve
        prefill += tokens
        if waiting.prompt is not None:
            prefilled.add(waiting.prompt)
    return StepPlan(expired, tuple(join))
