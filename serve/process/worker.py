"""The gunicorn worker: uvicorn's worker with the draining server and rlserve's logging.

Its workers share one listening socket, so a worker listens only once its models are loaded
(``ServerPhases.listen_after_load``); until then it tells gunicorn it is alive itself.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn_worker import UvicornWorker

from serve.process import logs
from serve.process.app import RLServeApp
from serve.process.server import DrainingServer


class RLServeWorker(UvicornWorker):
    # rlserve writes its own access log (serve.frontends.access): uvicorn's would format a
    # line per request.
    CONFIG_KWARGS: dict[str, Any] = {
        "loop": "auto",
        "http": "auto",
        "lifespan": "on",
        "access_log": False,
    }

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        app: RLServeApp = self.wsgi
        state = app.state
        logs.configure(state.settings.log_level)
        self.config.timeout_graceful_shutdown = int(state.settings.graceful_timeout_s)
        self.config.proxy_headers = state.settings.proxy_headers
        self.config.server_header = False
        state.phases.listen_after_load = True
        server = DrainingServer(self.config, app)
        self._install_sigquit_handler()
        heartbeat = asyncio.create_task(self._notify_until_started(server))
        await server.serve(sockets=self.sockets)
        heartbeat.cancel()
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)

    async def _notify_until_started(self, server: DrainingServer) -> None:
        """gunicorn's heartbeat while models load (uvicorn beats once it serves)."""
        while not server.started:
            self.notify()
            await asyncio.sleep(1.0)
