"""The server's phases, and the one place where the shutdown order is written down.

Phases: STARTING (listening; /health 200, /ready 503 while models load, verify and warm
up) -> READY -> DRAINING -> STOPPING.

A gunicorn worker (``serve.process.worker``) listens only once its models are loaded
(``listen_after_load``): its siblings accept from the same socket meanwhile, so a worker
that gunicorn starts or replaces never takes a connection it could only answer with 503.

Shutdown order, on SIGTERM (``serve.process.server.DrainingServer``):

1. DRAINING at once: /ready answers 503 so the load balancer takes this replica out of
   rotation; every request is still served, answers carry ``Connection: close``.
2. After ``drain_delay_s`` (time for endpoints to propagate): STOPPING. The server stops
   accepting connections, after taking those the kernel had already accepted (their
   requests are served); gives requests already on the wire ``ACCEPTED_GRACE_S`` to be
   read, and any connection with unread bytes up to ``UNREAD_GRACE_S`` more
   (``serve.process.server``); then closes idle keep-alive connections. A request a client
   wrote before that is answered, never reset.
3. In-flight requests finish: their work is queued or running in a batcher and completes
   within its deadline (uvicorn waits up to ``graceful_timeout_s``).
4. Lifespan shutdown: the gRPC server (when ``grpc_port`` is set) takes no new calls
   (UNAVAILABLE), its open streams stop reading, and the calls in flight are answered
   within ``graceful_timeout_s``; then each model's scheduler answers what is left in its
   queue (runs it, or 504 when its deadline passed), then its thread, if it started one,
   stops. Until this step gRPC calls are served as usual, and the gRPC health service
   answers NOT_SERVING from step 1 on, like /ready. The local lane (when ``lane`` is set)
   stops the same way after gRPC: no new lanes (from step 1 on a hello is refused with
   503), the calls in flight are answered, then every lane and the socket file go.
5. The process exits.

SIGINT (Ctrl-C in development) skips the delay of step 2; a second signal forces exit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import StrEnum

log = logging.getLogger("rlserve.phases")


class Phase(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"


class ServerPhases:
    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self.started_at = time.monotonic()
        self.listen_after_load = False
        self.loaded = asyncio.Event()  # set when loading ends, whether models loaded or not

    def ready(self) -> None:
        if self.phase is Phase.STARTING:
            self.phase = Phase.READY
            log.info("ready after %.2fs", time.monotonic() - self.started_at)

    def begin_drain(self) -> None:
        if self.phase in (Phase.STARTING, Phase.READY):
            self.phase = Phase.DRAINING
            log.info("draining: /ready answers 503, still serving")

    def begin_stop(self) -> None:
        if self.phase is not Phase.STOPPING:
            self.phase = Phase.STOPPING
            log.info("stopping: no new connections; finishing in-flight requests")

    @property
    def stopping(self) -> bool:
        return self.phase is Phase.STOPPING

    @property
    def draining(self) -> bool:
        return self.phase in (Phase.DRAINING, Phase.STOPPING)
