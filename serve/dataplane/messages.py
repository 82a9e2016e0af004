"""The protocol-neutral messages of the data plane.

A frontend (HTTP/JSON today; the Open Inference Protocol and gRPC next) decodes a call into
an :class:`InferenceRequest`; the model version that will validate it turns that into
:class:`Prepared` rows; the scheduler runs them in a batch and settles each request with an
:class:`InferenceResponse`, which the frontend encodes. Nothing here knows a wire format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from serve.types import Answer, PredictOptions


@dataclass(slots=True)
class InferenceRequest:
    """One call, decoded: inputs and parameters by name, as the frontend received them.

    ``inputs`` holds ``observations`` (and optionally ``actions`` to score) in request form:
    nested lists from JSON, or arrays from a binary protocol. ``parameters`` holds
    ``deterministic``, ``seed`` and ``outputs`` when the call gave them.
    """

    inputs: dict[str, Any]
    parameters: dict[str, Any]
    request_id: str
    received_at: float  # monotonic seconds
    deadline: float  # monotonic seconds


@dataclass(frozen=True, slots=True)
class Part:
    """Where a part of a request larger than a batch sits in the whole request."""

    offset: int  # its first row's index in the request
    total: int  # the request's rows


@dataclass(frozen=True, slots=True)
class SequenceStep:
    """A step of sequences whose memory the server holds (``serve.batching.sequences``):
    one sequence id per row, the rows that start or end their sequence, the graph inputs
    the held memory feeds, and the owner key the step's sequences are held under."""

    ids: tuple[str | int, ...]
    starts: np.ndarray  # bool [rows]
    ends: np.ndarray  # bool [rows]
    state_input: str
    start_input: str
    state_size: int  # floats of memory per row
    owner: str | None = None  # the call's sequence_owner; None: it gave none


@dataclass(slots=True)
class Prepared:
    """A validated request, ready to join a batch: its rows, how to answer it, and its
    identity and deadline. It holds no request data but its arrays: once a request is
    prepared, the decoded body can be freed."""

    feeds: dict[str, np.ndarray]  # graph input name -> [rows, ...]
    rows: int
    single: bool  # one observation, not a list: answer without the batch axis
    options: PredictOptions
    evaluate: np.ndarray | None  # given actions to score instead of choosing them
    request_id: str
    received_at: float  # monotonic seconds
    deadline: float  # monotonic seconds
    out_of_bounds: int = 0  # observations (rows) outside their Box's bounds, as given
    part: Part | None = None  # set on the parts of a request split across batches
    sequence: SequenceStep | None = None  # memory held by the server, fed when it is queued


@dataclass(frozen=True, slots=True)
class InferenceResponse:
    """One request's answer and the model version that computed it."""

    model: str
    version: int
    sha256: str
    outputs: Answer  # output name -> this request's rows (batch axis kept)
    single: bool  # the request held one observation: frontends drop the batch axis
