"""Logging set-up for the server process: one line per record; access lines are JSON."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    access = logging.getLogger("rlserve.access")
    access.setLevel(logging.INFO)  # access_log says whether it writes, not log_level
    access_handler = logging.StreamHandler(sys.stdout)
    access_handler.setFormatter(logging.Formatter("%(message)s"))
    access.handlers[:] = [access_handler]
    access.propagate = False
