"""What the fault injector asks of the server over HTTP: the model, the admin endpoints, and
which version every worker serves.

Admin calls carry ``Authorization: Bearer <token>`` and go over one keep-alive connection,
so that a hold and its resume reach the same worker even where holds do not propagate.
An answer is kept whole (status and body) for the report; a transport failure is an
answer with status 0. Reads are sent once more on a fresh connection when the kept-alive
one fails (it may have gone with a killed worker); updates never are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

POLICY_VERSION = "rl_policy_version"


@dataclass(frozen=True)
class Answer:
    status: int  # 0: no answer (the error is the body)
    body: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> dict[str, Any]:
        try:
            parsed = json.loads(self.body)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    def short(self, chars: int = 160) -> str:
        body = " ".join(self.body.split())
        return f"{self.status or 'no answer'} {body[:chars]}"


@dataclass(frozen=True)
class ModelView:
    """``GET /v1/models/{model}``, the parts the run uses."""

    name: str
    active_version: int | None
    versions: tuple[int, ...]
    held: bool
    default_deadline_ms: float


class ServerApi:
    def __init__(self, url: str, admin_token: str | None, timeout_s: float = 30) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.client = self._client()

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=self.timeout_s, headers=self.headers)

    def reconnect(self) -> None:
        """Drop the kept-alive connection (its worker may be gone): the next call opens one."""
        self.client.close()
        self.client = self._client()

    def close(self) -> None:
        self.client.close()

    def call(
        self,
        method: str,
        path: str,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        attempts = 2 if method == "GET" else 1  # a read is safe to send again
        for attempt in range(attempts):
            try:
                response = self.client.request(method, path, content=content, headers=headers)
            except httpx.TransportError as exc:
                # The kept-alive connection may have gone with a killed or drained worker.
                if attempt + 1 < attempts:
                    continue
                return Answer(0, f"{type(exc).__name__}: {exc}")
            return Answer(response.status_code, response.text)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ reading

    def first_model(self) -> str:
        answer = self.call("GET", "/v1/models")
        models = answer.json().get("models", []) if answer.ok else []
        if not models:
            raise LookupError(f"GET /v1/models: no model served ({answer.short()})")
        return str(models[0]["name"])

    def model(self, name: str) -> ModelView:
        answer = self.call("GET", f"/v1/models/{name}")
        if not answer.ok:
            raise LookupError(f"GET /v1/models/{name}: {answer.short()}")
        raw = answer.json()
        batching = raw.get("batching") or {}
        return ModelView(
            name=name,
            active_version=raw.get("active_version"),
            versions=tuple(int(v["version"]) for v in raw.get("versions", [])),
            held=bool(raw.get("held")),
            default_deadline_ms=float(batching.get("default_deadline_ms", 1000.0)),
        )

    def served_versions(self, model: str) -> dict[int, int]:
        """The active version of ``model`` in each live worker, by pid (``rl_policy_version``,
        one series per worker); {} when /metrics does not answer."""
        answer = self.call("GET", "/metrics")
        if not answer.ok:
            return {}
        served: dict[int, int] = {}
        for family in text_string_to_metric_families(answer.body):
            if family.name != POLICY_VERSION:
                continue
            for sample in family.samples:
                if sample.labels.get("model") == model and "pid" in sample.labels:
                    served[int(sample.labels["pid"])] = int(sample.value)
        return served

    def ready(self) -> Answer:
        return self.call("GET", "/ready")

    # ------------------------------------------------------------------ admin

    def push(self, model: str, version: int, data: bytes) -> Answer:
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Model-SHA256": hashlib.sha256(data).hexdigest(),
        }
        return self.call("PUT", f"/v1/models/{model}/versions/{version}", data, headers)

    def rollback(self, model: str) -> Answer:
        return self.call("POST", f"/v1/models/{model}/rollback")

    def hold(self, model: str, max_hold_s: float) -> Answer:
        return self.call("POST", f"/v1/models/{model}/hold?max_hold_s={max_hold_s:g}")

    def resume(self, model: str) -> Answer:
        return self.call("POST", f"/v1/models/{model}/resume")
