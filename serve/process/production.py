"""``rlserve serve`` with more than one worker: gunicorn in this process's place.

The production server is ``gunicorn --config serve/process/gunicorn_conf.py``, which takes every
setting from ``RLSERVE_*`` and the config file. So the flags given to ``rlserve serve`` are
handed on as ``RLSERVE_<NAME>`` variables (they outrank the environment and the file there
too, as they do here) and gunicorn replaces this process: signals reach its arbiter directly
and a SIGTERM drains every worker (docs/drain.md).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from serve.config import ENV_PREFIX

GUNICORN_CONFIG = Path(__file__).resolve().with_name("gunicorn_conf.py")

log = logging.getLogger("rlserve")


def environment(overrides: dict[str, Any]) -> dict[str, str]:
    """The given flags (``None``: not given) as RLSERVE_* variables, in the env's format."""
    return {
        ENV_PREFIX + name.upper(): _env_value(v) for name, v in overrides.items() if v is not None
    }


def run_gunicorn(overrides: dict[str, Any], workers: int) -> NoReturn:
    env = {**os.environ, **environment(overrides)}
    log.info("%d workers: running gunicorn --config %s", workers, GUNICORN_CONFIG)
    argv = [sys.executable, "-m", "gunicorn", "--config", str(GUNICORN_CONFIG)]
    os.execve(sys.executable, argv, env)


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)
