"""The mutating endpoints: push, activate, roll back, hold and resume a model's versions;
start, promote and roll back its canary.

All of them need ``Authorization: Bearer <admin_token>`` (401 without it, 403 with a wrong
one) and are disabled (403) while no ``admin_token`` is configured. The semantics live in
``serve.control.updates``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from kernel.errors import Forbidden, InvalidInput
from kernel.versions import DESCRIPTION, MAX_VERSION, parse_version, path_version
from serve.config import CanarySettings, Settings
from serve.control import pushed_files, store
from serve.control.canary_assignment import CanaryPlan, Judge
from serve.control.http_bodies import body_chunks, json_response, read_body, read_json_object
from serve.control.repository import MODEL_FILE
from serve.control.return_gate import Verdict
from serve.control.updates import ActivationMode, Push, Updater
from serve.frontends.access import check_bearer
from serve.frontends.wire import decode_object, positive_number
from serve.plugins import Canary

ROLLBACK_BODY_BYTES = 4096  # {"version": N} and room to spare
CANARY_BODY_BYTES = 4096  # a canary's settings: a handful of fields
DEFAULT_WAIT_S = 10.0  # an update waits this long for every worker to serve it
MAX_WAIT_S = 300.0


class AdminEndpoints:
    def __init__(self, updater: Updater, settings: Settings) -> None:
        self.updater = updater
        self.settings = settings

    def router(self) -> APIRouter:
        router = APIRouter(tags=["updates"], dependencies=[Depends(self.require_admin)])
        version = "/v1/models/{model}/versions/{version}"
        router.add_api_route(version, self.push_version, methods=["PUT"])
        router.add_api_route(f"{version}/activate", self.activate_version, methods=["POST"])
        router.add_api_route("/v1/models/{model}/rollback", self.rollback, methods=["POST"])
        router.add_api_route("/v1/models/{model}/hold", self.hold, methods=["POST"])
        router.add_api_route("/v1/models/{model}/resume", self.resume, methods=["POST"])
        canary = "/v1/models/{model}/canary"
        router.add_api_route(canary, self.start_canary, methods=["POST"])
        router.add_api_route(f"{canary}/promote", self.promote_canary, methods=["POST"])
        router.add_api_route(f"{canary}/rollback", self.roll_canary_back, methods=["POST"])
        return router

    def require_admin(self, request: Request) -> None:
        token = self.settings.admin_token
        if token is None:
            raise Forbidden(
                "admin endpoints are disabled: set admin_token (RLSERVE_ADMIN_TOKEN) to enable them"
            )
        check_bearer(token, request.headers.get("authorization", ""), "admin endpoints")

    async def push_version(self, request: Request, model: str, version: str) -> Response:
        """Push a new version: ONNX bytes (application/octet-stream, sha256 in X-Model-SHA256,
        options as query parameters), or JSON naming a file in the model repository."""
        number = parse_version(version)
        if number is None:
            raise InvalidInput(f"version: {version!r} is not {DESCRIPTION}")
        self.updater.check_push(model, number, _flag(request.query_params, "rollback"))
        push = await _push_from(request, self.settings, model, number)
        report = await self.updater.push(push)
        return json_response(report.to_json())

    async def activate_version(self, request: Request, model: str, version: str) -> Response:
        """Activate a resident version (query: mode, rollback, wait_s)."""
        query = request.query_params
        report = await self.updater.activate(
            model,
            path_version(version),
            _mode(query.get("mode")),
            _flag(query, "rollback"),
            _wait_s(query),
        )
        return json_response(report.to_json())

    async def rollback(self, request: Request, model: str) -> Response:
        """Re-activate a resident version at once: the previous one, or with a JSON body
        ``{"version": N}`` that older version; pull mode does not undo it (query: wait_s)."""
        version = await _rollback_version(request)
        report = await self.updater.rollback(model, _wait_s(request.query_params), version)
        return json_response(report.to_json())

    async def hold(self, request: Request, model: str) -> Response:
        """Serve nothing from this model until resume (or for max_hold_s seconds at most, a
        query parameter); requests wait within their deadlines, and /ready says it is held."""
        query = request.query_params
        max_hold_s = _seconds(query.get("max_hold_s"), "max_hold_s")
        spread = await self.updater.hold(model, max_hold_s, _wait_s(query))
        answer = {"model": model, "held": True, "max_hold_s": max_hold_s}
        return json_response({**answer, **spread.to_json()})

    async def resume(self, request: Request, model: str) -> Response:
        """Serve the model again after a hold (query: wait_s)."""
        spread = await self.updater.resume(model, _wait_s(request.query_params))
        return json_response({"model": model, "held": False, **spread.to_json()})

    async def start_canary(self, request: Request, model: str) -> Response:
        """Serve a share of the model's episodes on another version beside the live one,
        judged by the returns they earn (docs/rollouts.md); query: wait_s."""
        body = _canary_body(await read_json_object(request, CANARY_BODY_BYTES))
        try:
            plan = CanaryPlan.of(model, body, time.time())
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        spread = await self.updater.start_canary(plan, _wait_s(request.query_params))
        return json_response({"model": model, "canary": plan.to_json(), **spread.to_json()})

    async def promote_canary(self, request: Request, model: str) -> Response:
        """Activate the canary's version: it serves every episode (query: wait_s)."""
        return await self._end_canary(request, model, Verdict.PROMOTE)

    async def roll_canary_back(self, request: Request, model: str) -> Response:
        """End the canary: the live version serves every episode again (query: wait_s)."""
        return await self._end_canary(request, model, Verdict.ROLLBACK)

    async def _end_canary(self, request: Request, model: str, verdict: Verdict) -> Response:
        wait_s = _wait_s(request.query_params)
        report = await self.updater.end_canary(model, verdict, Judge.ADMIN, wait_s=wait_s)
        return json_response({**report.to_json(), "verdict": verdict.value})


async def _push_from(request: Request, settings: Settings, model: str, version: int) -> Push:
    limit = settings.max_model_bytes
    if request.headers.get("content-type", "").startswith("application/json"):
        raw = await read_json_object(request, limit)
        return await asyncio.to_thread(_push_from_json, settings, model, version, raw)
    sha256 = request.headers.get("x-model-sha256")
    if not sha256:
        raise InvalidInput("X-Model-SHA256: required with an ONNX body (the sha256 of the bytes)")
    query = request.query_params
    staged = await _upload(request, settings, model, version)
    return Push(
        model,
        version,
        staged,
        sha256,
        _flag(query, "activate", True),
        _mode(query.get("mode")),
        _flag(query, "rollback"),
        wait_s=_wait_s(query),
    )


_WRITE_BYTES = 1 << 20  # an upload is written in blocks of about this size


async def _upload(request: Request, settings: Settings, model: str, version: int) -> Path:
    """The body, streamed into a staging file of the repository as it arrives: a pushed
    model is never whole in memory, and the event loop never writes: a write can wait
    (the kernel throttles a process that dirties pages faster than the disk takes them),
    so each block of about 1 MiB is written on a worker thread."""
    root = settings.model_repository
    chunks = body_chunks(request, settings.max_model_bytes)
    staged = await asyncio.to_thread(store.staging, root, model, version) / MODEL_FILE
    try:
        with store.writing_to(root), open(staged, "wb") as file:
            block: list[bytes] = []
            size = 0
            async for chunk in chunks:
                block.append(chunk)
                size += len(chunk)
                if size >= _WRITE_BYTES:
                    await asyncio.to_thread(file.writelines, block)
                    block, size = [], 0
            await asyncio.to_thread(file.writelines, block)
    except BaseException:
        await asyncio.to_thread(store.discard, staged)
        raise
    return staged


class CanaryBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    observations: Any
    log_probs: list[float]
    actions: Any = None
    atol: float = Field(1e-5, ge=0)


class PushBody(BaseModel):
    """A push that names a file in the model repository instead of sending its bytes."""

    model_config = ConfigDict(extra="forbid")
    path: str
    sha256: str
    activate: bool = True
    mode: ActivationMode = ActivationMode.AT_BATCH_BOUNDARY
    rollback: bool = False
    canary: CanaryBody | None = None
    wait_s: float = Field(DEFAULT_WAIT_S, ge=0, le=MAX_WAIT_S)


def _push_from_json(settings: Settings, model: str, version: int, raw: dict[str, Any]) -> Push:
    try:
        body = PushBody.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    canary = Canary(**body.canary.model_dump()) if body.canary else None
    root, limit = settings.model_repository, settings.max_model_bytes
    staged = pushed_files.stage(root, model, version, body.path, limit)
    return Push(
        model,
        version,
        staged,
        body.sha256,
        body.activate,
        body.mode,
        body.rollback,
        canary,
        wait_s=body.wait_s,
    )


def _canary_body(raw: dict[str, Any]) -> CanarySettings:
    try:
        return CanarySettings.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        fields = list(CanarySettings.model_fields)
        raise InvalidInput(
            f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}; a canary is "
            f'{{"version": N, "share": 0.1}} with optional {fields[2:]}'
        ) from None


class RollbackBody(BaseModel):
    """What a rollback may name: the resident version to go back to."""

    model_config = ConfigDict(extra="forbid")
    version: StrictInt = Field(ge=1, le=MAX_VERSION)


async def _rollback_version(request: Request) -> int | None:
    """The version a rollback's body names; None without a body (the previous version)."""
    raw = await read_body(request, ROLLBACK_BODY_BYTES)
    if not raw.strip():
        return None
    try:
        return RollbackBody.model_validate(decode_object(raw)).version
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(
            f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}; a rollback takes "
            'no body (the previous version) or {"version": N}, N a resident version older '
            "than the active one"
        ) from None


def _wait_s(query: Any) -> float:
    """How long an update waits for the other workers to serve it (0: not at all)."""
    value = query.get("wait_s")
    if value is None:
        return DEFAULT_WAIT_S
    if value.strip() in ("0", "0.0"):
        return 0.0
    seconds = positive_number(value)
    if seconds is None or seconds > MAX_WAIT_S:
        raise InvalidInput(
            f"wait_s: expected seconds from 0 to {MAX_WAIT_S:g} (how long to wait for every "
            f"worker to serve the update), got {value!r}"
        )
    return seconds


def _seconds(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    seconds = positive_number(value)
    if seconds is None:
        raise InvalidInput(f"{name}: expected a positive number of seconds, got {value!r}")
    return seconds


def _mode(value: Any) -> ActivationMode:
    if value is None:
        return ActivationMode.AT_BATCH_BOUNDARY
    try:
        return ActivationMode(value)
    except ValueError:
        raise InvalidInput(
            f"mode: {value!r}; expected one of {[m.value for m in ActivationMode]}"
        ) from None


def _flag(query: Any, name: str, default: bool = False) -> bool:
    value = query.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false", "1", "0"):
        raise InvalidInput(f"{name}: expected true or false, got {value!r}")
    return value.lower() in ("true", "1")
