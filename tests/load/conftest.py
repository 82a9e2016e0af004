"""Servers for the load tests: the development server and gunicorn, on the demo policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.server import Server
from tests.load.gunicorn_server import start_gunicorn, stop_gunicorn
from tests.load.locust_runs import REPO

DEMO_REPOSITORY = REPO / "examples" / "model_repository"


@pytest.fixture(scope="module")
def rlserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``rlserve serve`` on the bundled, trained CartPole policy."""
    log = tmp_path_factory.mktemp("rlserve") / "log"
    server = Server.rlserve(DEMO_REPOSITORY, env={"RLSERVE_ACCESS_LOG": "false"}, log=log)
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def gunicorn(tmp_path: Path) -> Iterator[Server]:
    """gunicorn, 2 workers, on the demo policy; drains in half a second on SIGTERM."""
    server = start_gunicorn(DEMO_REPOSITORY, tmp_path, RLSERVE_DRAIN_DELAY_S="0.5")
    yield server
    stop_gunicorn(server)
