"""uvicorn, taught to drain: SIGTERM first takes the replica out of rotation, then stops.

See ``serve.process.phases`` for the whole shutdown order. Used by ``rlserve serve`` directly and
by the gunicorn worker (``serve.process.worker``).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from types import FrameType

import uvicorn

from serve.process.state import ServerState

# After the listeners close, connections accepted a moment before get this long to deliver
# their request (it is then served) before the connections still idle are closed.
ACCEPTED_GRACE_S = 0.5


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
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
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            self._drain_until = None
            super().handle_exit(self._pending_signal or signal.SIGTERM, None)
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.phases.begin_stop()
        for server in self.servers:
            server.close()  # stop accepting; uvicorn closes them again, harmlessly
        # uvicorn closes connections that look idle; one whose request is still in the
        # socket buffer would be dropped unanswered, so let such requests be read first.
        await asyncio.sleep(ACCEPTED_GRACE_S)
        await super().shutdown(sockets)
