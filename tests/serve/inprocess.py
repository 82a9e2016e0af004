"""The real application in this process, without a server: its lifespan run by hand and
httpx talking to it through its ASGI transport."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from serve import config
from serve.process.app import RLServeApp, create_app

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = ROOT / "examples" / "model_repository"


@asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[tuple[RLServeApp, httpx.AsyncClient]]:
    """The app after its lifespan started and its models loaded, and a client for it
    (a copy of the bundled CartPole repository unless ``model_repository`` says otherwise:
    live updates write into the repository)."""
    with tempfile.TemporaryDirectory(prefix="rlserve-inprocess-") as tmp:
        repository = settings.pop("model_repository", None)
        if repository is None:
            repository = Path(tmp) / "repository"
            shutil.copytree(REPOSITORY, repository, ignore=shutil.ignore_patterns(".*"))
        async with _serving(config.load(model_repository=repository, **settings)) as served:
            yield served


@asynccontextmanager
async def _serving(
    settings: config.Settings,
) -> AsyncIterator[tuple[RLServeApp, httpx.AsyncClient]]:
    app = create_app(settings)
    to_app: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    from_app: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan"}, to_app.get, from_app.put))
    await to_app.put({"type": "lifespan.startup"})
    assert (await from_app.get())["type"] == "lifespan.startup.complete"
    await app.state.phases.loaded.wait()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://rlserve") as client:
        yield app, client
    await to_app.put({"type": "lifespan.shutdown"})
    assert (await from_app.get())["type"] == "lifespan.shutdown.complete"
    await lifespan
