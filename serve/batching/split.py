"""Requests larger than a batch: cut into parts that queue like requests, answered as one.

An actor stepping 64 environments against a model whose ``max_batch_size`` is 32 sends one
request; the scheduler cuts it into parts of at most ``max_batch_size`` rows, all pinned to
the version active when the request was admitted, so the whole answer comes from one
version. Parts keep the request's deadline and options; a seeded request's parts draw
exactly what the whole request would have drawn (``Prepared.part``). The first part that
fails fails the request, and the parts still queued are dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from serve.dataplane.messages import InferenceResponse, Part, Prepared


def split(prepared: Prepared, rows: int) -> list[Prepared]:
    """``prepared`` as parts of at most ``rows`` rows, in order."""
    parts = []
    for start in range(0, prepared.rows, rows):
        stop = min(start + rows, prepared.rows)
        given = prepared.evaluate
        parts.append(
            dataclasses.replace(
                prepared,
                feeds={name: values[start:stop] for name, values in prepared.feeds.items()},
                rows=stop - start,
                evaluate=None if given is None else given[start:stop],
                out_of_bounds=prepared.out_of_bounds if start == 0 else 0,  # counted once
                part=Part(start, prepared.rows),
            )
        )
    return parts


def joined(
    parts: Sequence[asyncio.Future[InferenceResponse]], loop: asyncio.AbstractEventLoop
) -> asyncio.Future[InferenceResponse]:
    """One answer for the whole request, once every part has one."""
    whole: asyncio.Future[InferenceResponse] = loop.create_future()
    join = _Join(parts, whole)
    for part in parts:
        part.add_done_callback(join.part_done)
    whole.add_done_callback(join.whole_done)
    return whole


class _Join:
    """Collects the parts' answers into ``whole``; a failed or cancelled part ends it, and
    so does the caller giving up on ``whole`` (the parts still queued never run)."""

    def __init__(
        self,
        parts: Sequence[asyncio.Future[InferenceResponse]],
        whole: asyncio.Future[InferenceResponse],
    ) -> None:
        self.parts = parts
        self.whole = whole
        self.remaining = len(parts)

    def part_done(self, done: asyncio.Future[InferenceResponse]) -> None:
        self.remaining -= 1
        if self.whole.done():
            return
        if done.cancelled():
            self._cancel_parts()
            self.whole.cancel()
        elif (failure := done.exception()) is not None:
            self._cancel_parts()
            self.whole.set_exception(failure)
        elif self.remaining == 0:
            self.whole.set_result(merge([p.result() for p in self.parts]))

    def whole_done(self, done: asyncio.Future[InferenceResponse]) -> None:
        if done.cancelled():
            self._cancel_parts()

    def _cancel_parts(self) -> None:
        for part in self.parts:
            part.cancel()


def merge(answers: Sequence[InferenceResponse]) -> InferenceResponse:
    """The parts' answers as one, rows in order (every part ran on one version)."""
    first = answers[0]
    return dataclasses.replace(first, outputs=_concatenated([a.outputs for a in answers]))


def _concatenated(outputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    joined_outputs: dict[str, Any] = {}
    for name, value in outputs[0].items():
        pieces = [o[name] for o in outputs]
        if isinstance(value, dict):
            joined_outputs[name] = _concatenated(pieces)
        else:
            joined_outputs[name] = np.concatenate(pieces)
    return joined_outputs
