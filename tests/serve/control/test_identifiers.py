"""Requests and repository directories that name versions in any other spelling: refused
with a 404 or 422 (never a 500), skipped with a log line (never a crash)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from tests.serve.inprocess import REPOSITORY, serving

pytestmark = pytest.mark.anyio
OBS = {"observations": [0.0, 0.0, 0.0, 0.0]}
ADMIN = "identifiers-test-token"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    "version", ["0", "01", "+1", "%201", "%C2%B2", "%D9%A1", "9223372036854775808", "1.0"]
)
async def test_a_predict_path_with_a_malformed_version_is_404(version: str) -> None:
    async with serving() as (_, client):
        response = await client.post(f"/v1/models/cartpole/versions/{version}/predict", json=OBS)
        good = await client.post("/v1/models/cartpole/versions/1/predict", json=OBS)
    assert response.status_code == 404, response.text
    assert "ASCII digits only" in response.json()["error"]["message"]
    assert good.status_code == 200


@pytest.mark.parametrize("version", ["+3", "03", "%203", "1000000000000000000000000000000"])
async def test_pushes_and_activations_of_malformed_versions_are_refused(version: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN}", "X-Model-SHA256": "0" * 64}
    async with serving(admin_token=ADMIN) as (_, client):
        push = await client.put(
            f"/v1/models/cartpole/versions/{version}", content=b"x", headers=headers
        )
        activate = await client.post(
            f"/v1/models/cartpole/versions/{version}/activate", headers=headers
        )
    assert push.status_code == 422, push.text
    assert push.json()["error"]["code"] == "invalid_input"
    assert activate.status_code == 404, activate.text


async def test_repository_directories_that_are_not_versions_are_skipped_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.copytree(REPOSITORY / "cartpole", tmp_path / "cartpole")
    for name in ("v2", "\u0663", "007", "2.incoming"):
        shutil.copytree(REPOSITORY / "cartpole" / "1", tmp_path / "cartpole" / name)
    caplog.set_level(logging.WARNING, logger="rlserve")
    async with serving(model_repository=tmp_path) as (_, client):
        ready = await client.get("/ready")
        described = (await client.get("/v1/models/cartpole")).json()
    assert ready.status_code == 200
    assert [v["version"] for v in described["versions"]] == [1]
    skipped = [r.getMessage() for r in caplog.records if "not a version" in r.getMessage()]
    assert len(skipped) == 4
