"""A small Python client for rlserve (httpx): predictions and version updates, sync and async.

    from serve.client import PolicyClient
    with PolicyClient("http://127.0.0.1:8000", admin_token="...") as client:
        step = client.predict(obs, model="cartpole", outputs=("actions", "log_probs"))
        client.push("cartpole", 7, Path("model.onnx"))

Every answer carries the version that computed it (``Prediction.model_version``). A failed
call raises :class:`RequestFailed` with the server's status, error code and message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

_DEFAULT_OUTPUTS = ("actions",)


class RequestFailed(Exception):
    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.retry_after_s = (
            status,
            code,
            message,
            retry_after_s,
        )


@dataclass(frozen=True)
class Prediction:
    model: str
    model_version: int
    model_sha256: str
    actions: Any = None
    log_probs: Any = None
    values: Any = None
    distribution: Any = None


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    params: dict[str, str] | None = None
    headers: dict[str, str] | None = None


# ---------------------------------------------------------------------- requests and answers


def _predict_call(
    observations: Any,
    model: str | None,
    version: int | None,
    deterministic: bool,
    seed: int | None,
    outputs: Sequence[str],
    actions: Any,
    timeout_ms: float | None,
) -> _Call:
    body: dict[str, Any] = {
        "observations": _plain(observations),
        "deterministic": deterministic,
        "outputs": list(outputs),
    }
    if seed is not None:
        body["seed"] = seed
    if actions is not None:
        body["actions"] = _plain(actions)
    headers = {"X-Request-Timeout-Ms": f"{timeout_ms:g}"} if timeout_ms is not None else None
    return _Call("POST", _predict_path(model, version), json=body, headers=headers)


def _predict_path(model: str | None, version: int | None) -> str:
    if model is None:
        return "/predict"
    if version is None:
        return f"/v1/models/{model}/predict"
    return f"/v1/models/{model}/versions/{version}/predict"


def _push_call(
    model: str, version: int, onnx: bytes | Path, activate: bool, mode: str, rollback: bool
) -> _Call:
    data = onnx.read_bytes() if isinstance(onnx, Path) else onnx
    params = {"activate": str(activate).lower(), "mode": mode, "rollback": str(rollback).lower()}
    headers = {
        "Content-Type": "application/octet-stream",
        "X-Model-SHA256": hashlib.sha256(data).hexdigest(),
    }
    return _Call(
        "PUT",
        f"/v1/models/{model}/versions/{version}",
        content=data,
        params=params,
        headers=headers,
    )


def _activate_call(model: str, version: int, mode: str, rollback: bool) -> _Call:
    params = {"mode": mode, "rollback": str(rollback).lower()}
    return _Call("POST", f"/v1/models/{model}/versions/{version}/activate", params=params)


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def _result(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json()
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:300]
    retry = response.headers.get("Retry-After")
    raise RequestFailed(response.status_code, code, message, float(retry) if retry else None)


def _prediction(body: dict[str, Any]) -> Prediction:
    fields = ("actions", "log_probs", "values", "distribution")
    return Prediction(
        body["model"], body["model_version"], body["model_sha256"], *(body.get(f) for f in fields)
    )


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# ---------------------------------------------------------------------- clients


class PolicyClient:
    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        timeout_s: float = 10.0,
        **httpx_options: Any,
    ) -> None:
        self._http = httpx.Client(
            base_url=url, timeout=timeout_s, headers=_auth(admin_token), **httpx_options
        )

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call) -> Any:
        return _result(
            self._http.request(
                call.method,
                call.path,
                json=call.json,
                content=call.content,
                params=call.params,
                headers=call.headers,
            )
        )

    def predict(
        self,
        observations: Any,
        *,
        model: str | None = None,
        version: int | None = None,
        deterministic: bool = True,
        seed: int | None = None,
        outputs: Sequence[str] = _DEFAULT_OUTPUTS,
        actions: Any = None,
        timeout_ms: float | None = None,
    ) -> Prediction:
        call = _predict_call(
            observations, model, version, deterministic, seed, outputs, actions, timeout_ms
        )
        return _prediction(self._send(call))

    def push(
        self, model: str, version: int, onnx: bytes | Path, *, activate: bool = True,
        mode: str = "at_batch_boundary", rollback: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        return dict(self._send(_push_call(model, version, onnx, activate, mode, rollback)))

    def activate(
        self, model: str, version: int, *, mode: str = "at_batch_boundary", rollback: bool = False
    ) -> dict[str, Any]:
        return dict(self._send(_activate_call(model, version, mode, rollback)))

    def rollback(self, model: str) -> dict[str, Any]:
        return dict(self._send(_Call("POST", f"/v1/models/{model}/rollback")))

    def hold(self, model: str) -> dict[str, Any]:
        return dict(self._send(_Call("POST", f"/v1/models/{model}/hold")))

    def resume(self, model: str) -> dict[str, Any]:
        return dict(self._send(_Call("POST", f"/v1/models/{model}/resume")))

    def model(self, model: str) -> dict[str, Any]:
        return dict(self._send(_Call("GET", f"/v1/models/{model}")))


class AsyncPolicyClient:
    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        timeout_s: float = 10.0,
        **httpx_options: Any,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=url, timeout=timeout_s, headers=_auth(admin_token), **httpx_options
        )

    async def __aenter__(self) -> AsyncPolicyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call) -> Any:
        response = await self._http.request(
            call.method,
            call.path,
            json=call.json,
            content=call.content,
            params=call.params,
            headers=call.headers,
        )
        return _result(response)

    async def predict(
        self,
        observations: Any,
        *,
        model: str | None = None,
        version: int | None = None,
        deterministic: bool = True,
        seed: int | None = None,
        outputs: Sequence[str] = _DEFAULT_OUTPUTS,
        actions: Any = None,
        timeout_ms: float | None = None,
    ) -> Prediction:
        call = _predict_call(
            observations, model, version, deterministic, seed, outputs, actions, timeout_ms
        )
        return _prediction(await self._send(call))

    async def push(
        self, model: str, version: int, onnx: bytes | Path, *, activate: bool = True,
        mode: str = "at_batch_boundary", rollback: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        return dict(await self._send(_push_call(model, version, onnx, activate, mode, rollback)))

    async def activate(
        self, model: str, version: int, *, mode: str = "at_batch_boundary", rollback: bool = False
    ) -> dict[str, Any]:
        return dict(await self._send(_activate_call(model, version, mode, rollback)))

    async def rollback(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("POST", f"/v1/models/{model}/rollback")))

    async def hold(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("POST", f"/v1/models/{model}/hold")))

    async def resume(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("POST", f"/v1/models/{model}/resume")))

    async def model(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("GET", f"/v1/models/{model}")))
