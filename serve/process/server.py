"""uvicorn, taught to drain: SIGTERM first takes the replica out of rotation, then stops.

See ``serve.process.phases`` for the whole shutdown order. Used by ``rlserve serve`` directly and
by the gunicorn worker (``serve.process.worker``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from types import FrameType
from typing import Any

import uvicorn

from serve.process import protocol
from serve.process.app import RLServeApp

# After the listeners close, connections accepted a moment before get this long to deliver
# their request (it is then served) before the connections still idle are closed.
ACCEPTED_GRACE_S = 0.5
# An idle keep-alive connection with bytes waiting in its socket holds a request the client
# already wrote: it is read and answered before the connection closes, waiting at most this.
UNREAD_GRACE_S = 2.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: RLServeApp) -> None:
        state = app.state
        settings = state.settings
        gate = app.transports.predict.refuse_early
        data_plane = app if settings.http_data_plane == "protocol" else None
        # uvicorn rewrites the client's address from proxy headers in a middleware that
        # answers without a task would pass by: with proxy_headers, every call has its task
        config.http = protocol.configured(
            settings.header_timeout_s,
            settings.body_timeout_s,
            gate,
            data_plane,
            answer_now=not settings.proxy_headers,
        )
        super().__init__(config)
        self.state = state
        self._next_sweep = 0.0
        self._drain_until: float | None = None
        self._pending_signal: int | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        delay = self.state.settings.drain_delay_s
        first = self._pending_signal is None and not self.should_exit
        self.state.phases.begin_drain()
        if first and sig == signal.SIGTERM and delay > 0:
            self._pending_signal = sig  # keep serving; on_tick stops us after the delay
            self._drain_until = time.monotonic() + delay
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + protocol.SWEEP_S
            self._sweep(asyncio.get_running_loop().time())
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            self._drain_until = None
            super().handle_exit(self._pending_signal or signal.SIGTERM, None)
        return await super().on_tick(counter)

    def _sweep(self, now: float) -> None:
        """Requests that arrive too slowly are answered 408 and their connections closed."""
        for connection in list(self.server_state.connections):
            if isinstance(connection, protocol.TimedHttpToolsProtocol):
                connection.check_timeouts(now)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.phases.begin_stop()
        # Stop accepting, but first take the connections the kernel already accepted: their
        # clients may have written a request, which closing the listener would reset.
        spares = [os.dup(s.fileno()) for server in self.servers for s in server.sockets or ()]
        for server in self.servers:
            server.close()  # uvicorn closes them again, harmlessly
        for spare in spares:
            await self._take_backlog(spare)
        # uvicorn closes connections that look idle; one whose request is still in the
        # socket buffer would be dropped unanswered, so let such requests be read first.
        await asyncio.sleep(ACCEPTED_GRACE_S)
        await self._read_what_was_written()
        await super().shutdown(sockets)

    async def _take_backlog(self, fd: int) -> None:
        """Serve every connection waiting in a listening socket's backlog, then close it.
        The backlog is emptied in one pass, without yielding: clients that reconnect once
        answered cannot keep the listener open."""
        loop = asyncio.get_running_loop()
        waiting: list[socket.socket] = []
        with socket.socket(fileno=fd) as listener:
            listener.setblocking(False)
            while True:
                try:
                    accepted, _ = listener.accept()
                except OSError:  # empty (BlockingIOError), or not a socket we can take from
                    break
                accepted.setblocking(False)
                waiting.append(accepted)
        for accepted in waiting:
            await loop.connect_accepted_socket(self._protocol, accepted)

    def _protocol(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn builds it for its listeners."""
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol

    async def _read_what_was_written(self) -> None:
        """uvicorn closes a connection that looks idle; if the client wrote its next request
        a moment ago, the bytes wait in the socket and closing would reset them. Let the
        loop read such requests first: they start a request cycle, and are answered (with
        ``Connection: close``, the server is draining)."""
        deadline = time.monotonic() + UNREAD_GRACE_S
        while time.monotonic() < deadline:
            if not any(_idle_with_unread_bytes(c) for c in self.server_state.connections):
                return
            await asyncio.sleep(0.005)


def _idle_with_unread_bytes(connection: Any) -> bool:
    cycle = getattr(connection, "cycle", None)
    if cycle is not None and not cycle.response_complete:
        return False  # busy: uvicorn lets it finish
    transport = getattr(connection, "transport", None)
    if transport is None or transport.is_closing():
        return False
    return protocol.unread_bytes(transport)
