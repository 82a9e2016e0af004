"""An HTTP call as the lean data-plane frontends see it (the JSON predict routes and the
Open Inference Protocol's REST routes): its identity and deadline header from one pass over
the headers, and its body, read whole within a size limit."""

from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.types import Receive, Scope

from serve.access import given_request_id, new_request_id
from serve.dataplane.wire import too_large

# Bodies up to this size are decoded and validated on the event loop (a few milliseconds
# at most); larger ones on a worker thread, so no request holds the loop in proportion to
# its size. An image observation (4x84x84 as JSON) is about 100 KB.
INLINE_BODY_BYTES = 256 * 1024


@dataclass(slots=True)
class Call:
    """What the handler learns about a call as it goes (for its error answer and metrics)."""

    request_id: str
    received_at: float
    timeout_header: str | None = None
    declared_length: int | None = None
    model: str = ""  # the metrics label: a served model's name, once routed
    version: int | None = None


class Disconnected(Exception):
    """The client went away before its request was read: there is no one to answer."""


def start_call(scope: Scope) -> Call:
    """The call's request id, deadline header and declared length, in one pass over headers."""
    call = Call("", time.monotonic())
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            call.request_id = given_request_id(value) or ""
        elif name == b"x-request-timeout-ms":
            call.timeout_header = value.decode("latin-1")
        elif name == b"content-length" and value.isdigit():
            call.declared_length = int(value)
    if not call.request_id:
        call.request_id = new_request_id()
    return call


async def read_body(receive: Receive, declared: int | None, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it is known to exceed ``limit``."""
    if declared is not None and declared > limit:
        raise too_large(declared, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit)
        if not message.get("more_body", False):
            return chunk if not chunks else b"".join([*chunks, chunk])
        chunks.append(chunk)
