"""Readiness tells the truth about what can be served."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.serve.inprocess import REPOSITORY, serving

pytestmark = pytest.mark.anyio

# The service guide's /health answer, verbatim (tests/serve/test_config_file.py checks the copy).
GUIDE_HEALTH = Path(__file__).parents[1] / "reference" / "health.json"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_model_whose_only_version_fails_to_load_keeps_ready_red(tmp_path: Path) -> None:
    shutil.copytree(REPOSITORY / "cartpole", tmp_path / "cartpole")
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    async with serving(model_repository=tmp_path) as (_, client):
        ready = await client.get("/ready")
        models = (await client.get("/v1/models")).json()["models"]
        described = (await client.get("/v1/models/broken")).json()
        served = await client.post("/v1/models/cartpole/predict", json={"observations": [0] * 4})
    assert ready.status_code == 503
    assert any("'broken' has no loaded version" in r for r in ready.json()["reasons"])
    assert {m["name"]: m["state"] for m in models} == {"cartpole": "ready", "broken": "unavailable"}
    assert described["failed_versions"][0]["state"] == "unavailable"
    assert "onnxruntime cannot load it" in described["failed_versions"][0]["reason"]
    assert served.status_code == 200  # the model that loaded is served meanwhile


async def test_ready_turns_green_once_every_model_has_an_active_version() -> None:
    async with serving() as (app, client):
        ready = await client.get("/ready")
        app.state.phases.begin_drain()
        draining = await client.get("/ready")
    assert ready.json() == {"status": "ready", "phase": "ready"}
    assert draining.status_code == 503
    assert draining.json()["reasons"][0] == "server is draining"


async def test_a_held_model_turns_ready_red_with_the_reason_until_resumed() -> None:
    headers = {"Authorization": "Bearer readiness-test-token"}
    async with serving(admin_token="readiness-test-token") as (_, client):
        held = await client.post("/v1/models/cartpole/hold", headers=headers)
        while_held = await client.get("/ready")
        described = (await client.get("/v1/models/cartpole")).json()
        await client.post("/v1/models/cartpole/resume", headers=headers)
        resumed = await client.get("/ready")
    answer = held.json()
    assert (answer["model"], answer["held"], answer["max_hold_s"]) == ("cartpole", True, None)
    assert (answer["all_workers"], list(answer["workers"].values())) == (True, [1])
    assert while_held.status_code == 503
    assert "model 'cartpole' is held" in while_held.json()["reasons"][0]
    assert described["held"] is True
    assert described["held_for_s"] >= 0
    assert resumed.status_code == 200


async def test_a_hold_with_max_hold_s_ends_by_itself() -> None:
    headers = {"Authorization": "Bearer readiness-test-token"}
    async with serving(admin_token="readiness-test-token") as (_, client):
        await client.post("/v1/models/cartpole/hold?max_hold_s=0.2", headers=headers)
        queued = asyncio.create_task(
            client.post("/predict", json={"observations": [0.0] * 4})
        )  # waits for the hold to end, well within its deadline
        assert (await client.get("/ready")).status_code == 503
        answered = await queued
        bad = await client.post("/v1/models/cartpole/hold?max_hold_s=-1", headers=headers)
        ready = await client.get("/ready")
    assert answered.status_code == 200
    assert ready.status_code == 200
    assert bad.status_code == 422
    assert "max_hold_s" in bad.json()["error"]["message"]


async def test_health_answers_in_the_service_guides_shape() -> None:
    guide = json.loads(GUIDE_HEALTH.read_text())
    async with serving() as (_, client):
        health = await client.get("/health")
    answer = health.json()
    assert health.status_code == 200
    assert answer["status"] == guide["status"] == "healthy"
    assert isinstance(answer["model_version"], type(guide["model_version"]))  # a string
    assert answer == {
        "status": "healthy",
        "model_version": "1",
        "gpu_utilization": None,  # no GPU here; a number from 0 to 1 from NVML where there is one
        "model_versions": {"cartpole": 1},
    }


async def test_health_of_several_models_lists_each_ones_version(tmp_path: Path) -> None:
    for name in ("cartpole", "second"):
        shutil.copytree(REPOSITORY / "cartpole", tmp_path / name)
    async with serving(model_repository=tmp_path) as (_, client):
        health = (await client.get("/health")).json()
    assert health["status"] == "healthy"
    assert health["model_version"] is None  # not one model's: see model_versions
    assert health["model_versions"] == {"cartpole": 1, "second": 1}
