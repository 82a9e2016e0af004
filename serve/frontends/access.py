"""What every HTTP exchange gets: a request id, one structured access-log line, and
``Connection: close`` while the server drains (so clients reconnect to another replica);
and the one check of the admin bearer token (:func:`check_bearer`), which the admin routes
and the system shared-memory registry (HTTP headers and gRPC metadata alike) share.

The predict frontend (``serve.frontends.predict.http``) does this inline; :class:`AccessMiddleware`
does it for the control-plane application. Both use the functions here, and one
:class:`AccessLog`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import random
import time
from collections.abc import Callable

import orjson
from pydantic import SecretStr
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernel.errors import Forbidden, Unauthorized

log = logging.getLogger("rlserve.access")


def request_id(scope: Scope) -> str:
    """The caller's X-Request-Id (1 to 128 bytes), or a new random one."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            given = given_request_id(value)
            if given is not None:
                return given
    return new_request_id()


def given_request_id(value: bytes) -> str | None:
    """An X-Request-Id header's value, when it is one we keep (1 to 128 bytes)."""
    return value.decode("latin-1") if 0 < len(value) <= 128 else None


def new_request_id() -> str:
    """24 random hex digits: unique enough to find one call in the logs (96 bits), from
    the process's own generator, seeded from the OS, without a system call per request.
    A forked worker draws from a generator of its own (``random`` reseeds after fork)."""
    return f"{random.getrandbits(96):024x}"


def check_bearer(token: SecretStr, authorization: str, guarded: str) -> None:
    """``authorization`` (the ``Authorization`` header, or gRPC's ``authorization``
    metadata) is ``Bearer <token>``: else Unauthorized (no bearer token) or Forbidden (another
    one). ``guarded`` names what the token guards, for the message; the token never shows."""
    if not authorization.lower().startswith("bearer "):
        raise Unauthorized(
            f"{guarded}: missing bearer token: send Authorization: Bearer <admin_token>"
        )
    given = authorization[7:].strip().encode()
    if not hmac.compare_digest(given, token.get_secret_value().encode()):
        raise Forbidden(f"{guarded}: the bearer token does not match admin_token")


FLUSH_S = 0.01  # how long the access log gathers lines before it writes them


class AccessLog:
    """The access log (``access_log``): one JSON line per answered request, on the
    ``rlserve.access`` logger (stdout). Lines are gathered for FLUSH_S after the first of
    them, then written together as one log record (and at shutdown): a record per request
    (the logging module's record, its formatting and the stream's flush) cost 25-30 µs of
    CPU a request at 64 connections on this project's machine, a quarter of a small predict
    call, and about 60 µs for a lone one. A handler of that logger may therefore get
    several lines in one record's message; a process killed outright loses the lines of
    its last FLUSH_S."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def add(self, scope: Scope, request_id: str, status: int, seconds: float) -> None:
        """The line of an exchange answered with ``status`` after ``seconds`` (called on
        the event loop)."""
        client = scope.get("client")
        record = {
            "request_id": request_id,
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "latency_ms": round(seconds * 1000, 3),
            "client": client[0] if client else None,
        }
        if not self._lines:  # the first line since the last write: the next one is due
            asyncio.get_running_loop().call_later(FLUSH_S, self.flush)
        self._lines.append(orjson.dumps(record).decode())

    def flush(self) -> None:
        """Write the lines gathered so far (FLUSH_S after the first, and at shutdown)."""
        if self._lines:
            lines, self._lines = self._lines, []
            log.info("\n".join(lines))


class AccessMiddleware:
    """A pure ASGI middleware: one wrapper around the app, no per-request task or body copy."""

    def __init__(
        self, app: ASGIApp, draining: Callable[[], bool], access_log: AccessLog | None
    ) -> None:
        self.app = app
        self.draining = draining
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        started = time.perf_counter()
        status = 500

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers["X-Request-Id"] = rid
                if self.draining():
                    headers["Connection"] = "close"
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            if self.access_log is not None:
                self.access_log.add(scope, rid, status, time.perf_counter() - started)
