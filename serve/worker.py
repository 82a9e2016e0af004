"""The gunicorn worker: uvicorn's worker with the draining server and rlserve's logging."""

from __future__ import annotations

import sys
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn_worker import UvicornWorker

from serve import logs
from serve.server import DrainingServer
from serve.state import ServerState


class RLServeWorker(UvicornWorker):
    CONFIG_KWARGS: dict[str, Any] = {"loop": "auto", "http": "auto", "lifespan": "on"}

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        state: ServerState = self.wsgi.state.rlserve
        logs.configure(state.settings.log_level)
        self.config.timeout_graceful_shutdown = int(state.settings.graceful_timeout_s)
        server = DrainingServer(self.config, state)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
