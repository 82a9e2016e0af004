"""A small Python client for rlserve: predictions and version updates, sync and async.

    from client.policy import PolicyClient
    with PolicyClient("http://127.0.0.1:8000", admin_token="...") as client:
        step = client.predict(obs, model="cartpole", outputs=("actions", "log_probs"))
        client.push("cartpole", 7, Path("model.onnx"))

Every answer carries the version that computed it (``Prediction.model_version``). A failed
call raises :class:`RequestFailed` with the server's status, error code and message.

An RL actor calls ``predict`` once per environment step, so the client's own cost per call
matters as much as the server's: :class:`PolicyClient` keeps one keep-alive connection per
thread (``client.connection``: a request in one send, the answer parsed by
httptools, about 30 µs of CPU a call where the standard library's ``http.client`` takes
about 105) and encodes with orjson, numpy arrays included. :class:`AsyncPolicyClient`
does the same over httpx's async connection pool.

On the server's own host, ``PolicyClient(url, lane=path)`` sends predictions through the
server's local lane (``rlserve serve --lane PATH``; ``client.lane``): arrays in shared
memory, no HTTP. When no server answers at that path the client says so (a warning) and
predicts over HTTP, trying the lane again every ``LANE_RETRY_S`` seconds (a restarted server
is found again); a call giving ``actions`` to score always goes over HTTP.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import Any

import httpx
import orjson

from client.connection import Answer, Connection
from client.lane import LaneClient, LaneUnavailable
from client.prediction import Prediction, RequestFailed

__all__ = ["AsyncPolicyClient", "Memory", "PolicyClient", "Prediction", "RequestFailed"]

log = logging.getLogger("rlserve.client")

_DEFAULT_OUTPUTS = ("actions",)
_JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] | None = None
    repeatable: bool = True  # safe to send again when a kept-alive connection turned out closed

    @property
    def target(self) -> str:
        query = urllib.parse.urlencode(self.params) if self.params else ""
        return f"{self.path}?{query}" if query else self.path


# ---------------------------------------------------------------------- requests and answers


@dataclass(frozen=True)
class Memory:
    """A recurrent policy's memory for one call: the state the client holds (``state``,
    ``episode_start``), or the sequence whose state the server holds (``sequence_id``,
    ``sequence_start``, ``sequence_end``); docs/serving.md."""

    state: Any = None
    episode_start: Any = None
    sequence_id: Any = None
    sequence_start: Any = None
    sequence_end: Any = None

    def fields(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @property
    def held_by_server(self) -> bool:
        return any(
            v is not None for v in (self.sequence_id, self.sequence_start, self.sequence_end)
        )


@dataclass(frozen=True)
class _LaneArguments:
    """What a call gives beside its observations, as ``LaneClient.predict`` takes it."""

    inputs: dict[str, Any]  # by predict field: action masks, a client-held state
    sequence: dict[str, Any]  # a server-held sequence: its id, start and end


def _lane_arguments(action_masks: Any, memory: Memory | None) -> _LaneArguments | None:
    """The call's arguments for the local lane; None when only HTTP carries them (a
    server-held sequence named by strings: the lane takes integer ids)."""
    inputs: dict[str, Any] = {}
    sequence: dict[str, Any] = {}
    if memory is not None and memory.held_by_server:
        if not _integer_ids(memory.sequence_id):
            return None
        sequence = {
            "sequence_id": memory.sequence_id,
            "sequence_start": False if memory.sequence_start is None else memory.sequence_start,
            "sequence_end": False if memory.sequence_end is None else memory.sequence_end,
        }
    elif memory is not None:
        inputs = memory.fields()
    if action_masks is not None:
        inputs["action_masks"] = action_masks
    return _LaneArguments(inputs, sequence)


def _integer_ids(value: Any) -> bool:
    """Whether a sequence id (or a list, one per row) is made of integers only."""
    ids = value if isinstance(value, list) else [value]
    return bool(ids) and all(isinstance(i, Integral) and not isinstance(i, bool) for i in ids)


def _predict_call(
    observations: Any,
    model: str | None,
    version: int | None,
    deterministic: bool,
    seed: int | None,
    outputs: Sequence[str],
    actions: Any,
    timeout_ms: float | None,
    action_masks: Any,
    memory: Memory | None,
    episode_key: str | None,
) -> _Call:
    body: dict[str, Any] = {
        "observations": observations,
        "deterministic": deterministic,
        "outputs": list(outputs),
    }
    if seed is not None:
        body["seed"] = seed
    if actions is not None:
        body["actions"] = actions
    if action_masks is not None:
        body["action_masks"] = action_masks
    if memory is not None:
        body.update(memory.fields())
    headers = dict(_JSON)
    if timeout_ms is not None:
        headers["X-Request-Timeout-Ms"] = f"{timeout_ms:g}"
    if episode_key is not None:
        headers["X-Episode-Key"] = episode_key
    return _Call("POST", _predict_path(model, version), _json(body), headers)


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
    return _Call("PUT", f"/v1/models/{model}/versions/{version}", data, headers, params)


def _push_path_call(
    model: str, version: int, path: str, sha256: str, activate: bool, mode: str, rollback: bool
) -> _Call:
    body = {
        "path": path,
        "sha256": sha256,
        "activate": activate,
        "mode": mode,
        "rollback": rollback,
    }
    headers = {"Content-Type": "application/json"}
    return _Call("PUT", f"/v1/models/{model}/versions/{version}", _json(body), headers)


def _activate_call(model: str, version: int, mode: str, rollback: bool) -> _Call:
    params = {"mode": mode, "rollback": str(rollback).lower()}
    path = f"/v1/models/{model}/versions/{version}/activate"
    return _Call("POST", path, params=params, repeatable=False)


def _hold_call(model: str, max_hold_s: float | None) -> _Call:
    params = None if max_hold_s is None else {"max_hold_s": f"{max_hold_s:g}"}
    return _Call("POST", f"/v1/models/{model}/hold", params=params)


def _rollback_call(model: str, version: int | None) -> _Call:
    path = f"/v1/models/{model}/rollback"
    if version is None:
        return _Call("POST", path, repeatable=False)
    body, headers = _json({"version": version}), {"Content-Type": "application/json"}
    return _Call("POST", path, body, headers, repeatable=False)


@dataclass(frozen=True)
class EpisodeOutcome:
    """How an episode went, on the version that served every one of its steps."""

    model_version: int
    episode_return: float
    length: int | None = None
    terminated: bool = False
    truncated: bool = False

    def body(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "model_version": int(self.model_version),
            "return": float(self.episode_return),
            "terminated": bool(self.terminated),
            "truncated": bool(self.truncated),
        }
        if self.length is not None:
            fields["length"] = int(self.length)
        return fields


def _episode_call(model: str, body: dict[str, Any], token: str | None) -> _Call:
    headers = {"Content-Type": "application/json", **_auth(token)}
    return _Call("POST", f"/v1/models/{model}/episodes", _json(body), headers, repeatable=False)


def _canary_call(model: str, version: int, share: float, gate: dict[str, Any]) -> _Call:
    body = {"version": version, "share": share, **{k: v for k, v in gate.items() if v is not None}}
    headers = {"Content-Type": "application/json"}
    return _Call("POST", f"/v1/models/{model}/canary", _json(body), headers, repeatable=False)


def _json(body: Any) -> bytes:
    """JSON bytes; numpy arrays and scalars as their values (float32 in its shortest form)."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _result(reply: Answer) -> Any:
    if 200 <= reply.status < 300:
        return orjson.loads(reply.body)
    try:
        error = orjson.loads(reply.body)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code, message = "http_error", reply.body[:300].decode("utf-8", "replace")
    retry = reply.retry_after
    raise RequestFailed(reply.status, code, message, float(retry) if retry else None)


def _prediction(body: dict[str, Any]) -> Prediction:
    fields = ("actions", "log_probs", "values", "distribution", "q_values", "state")
    return Prediction(
        body["model"], body["model_version"], body["model_sha256"], *(body.get(f) for f in fields)
    )


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# ---------------------------------------------------------------------- transports


class _KeepAlive:
    """One HTTP/1.1 keep-alive connection per thread (``client.connection``), opened on
    first use and again after the server closed it (an idle timeout, or ``Connection:
    close`` while it drains)."""

    _STALE = (ConnectionResetError, BrokenPipeError)

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str]) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url: expected http(s)://host[:port], got {url!r}")
        self._tls = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._headers = {"Accept-Encoding": "identity", **headers}
        self._local = threading.local()
        self._opened: list[Connection] = []
        self._lock = threading.Lock()

    def send(self, call: _Call) -> Answer:
        reused = getattr(self._local, "connection", None) is not None
        try:
            return self._exchange(self._connection(), call)
        except self._STALE:
            self._drop()
            if not (reused and call.repeatable):
                raise
        return self._exchange(self._connection(), call)  # the kept-alive one had closed

    def _exchange(self, connection: Connection, call: _Call) -> Answer:
        headers = {**self._headers, **call.headers} if call.headers else self._headers
        try:
            target = self._prefix + call.target
            answer = connection.exchange(call.method, target, headers, call.body)
        except BaseException:
            self._drop()
            raise
        if not answer.keep_alive:
            self._drop()
        return answer

    def _connection(self) -> Connection:
        connection: Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = Connection(
                self._host, self._port, tls=self._tls, timeout_s=self._timeout_s
            )
            self._local.connection = connection
            with self._lock:
                self._opened.append(connection)
        return connection

    def _drop(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def close(self) -> None:
        with self._lock:
            for connection in self._opened:
                connection.close()
            self._opened.clear()
        self._local = threading.local()


# ---------------------------------------------------------------------- clients


LANE_RETRY_S = 10.0  # after the lane failed, predictions go over HTTP this long


class PolicyClient:
    """Thread-safe: each thread that uses it gets its own connection."""

    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        timeout_s: float = 10.0,
        lane: str | Path | None = None,
    ):
        self._http = _KeepAlive(url, timeout_s, _auth(admin_token))
        self._lane = None if lane is None else LaneClient(lane, timeout_s=timeout_s)
        self._lane_retry_at = 0.0  # monotonic time; before it, predictions go over HTTP

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()
        if self._lane is not None:
            self._lane.close()

    def _send(self, call: _Call) -> Any:
        return _result(self._http.send(call))

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
        action_masks: Any = None,
        memory: Memory | None = None,
        episode_key: str | None = None,
    ) -> Prediction:
        """``action_masks``: a masked policy's (MaskablePPO); ``memory``: a recurrent
        policy's state, or its server-held sequence (over the lane when its ids are
        integers, else over HTTP); ``episode_key``: the episode (or actor) every call of
        one episode names, so that a model's canary serves it on one version (over HTTP;
        over the lane, the lane is the key: it is one actor's)."""
        lane = _lane_arguments(action_masks, memory)
        over_lane = actions is None and lane is not None  # the lane scores no actions
        if self._lane is not None and over_lane and time.monotonic() >= self._lane_retry_at:
            assert lane is not None
            try:
                return self._lane.predict(
                    observations, model=model, version=version, deterministic=deterministic,
                    seed=seed, outputs=outputs, timeout_ms=timeout_ms, inputs=lane.inputs,
                    **lane.sequence,
                )  # fmt: skip
            except LaneUnavailable as exc:
                log.warning("%s; predicting over HTTP, the lane again in %gs", exc, LANE_RETRY_S)
                self._lane_retry_at = time.monotonic() + LANE_RETRY_S
        call = _predict_call(
            observations, model, version, deterministic, seed, outputs, actions, timeout_ms,
            action_masks, memory, episode_key,
        )  # fmt: skip
        return _prediction(self._send(call))

    def push(
        self, model: str, version: int, onnx: bytes | Path, *, activate: bool = True,
        mode: str = "at_batch_boundary", rollback: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        return dict(self._send(_push_call(model, version, onnx, activate, mode, rollback)))

    def push_from_repository(
        self, model: str, version: int, path: str, sha256: str, *, activate: bool = True,
        mode: str = "at_batch_boundary", rollback: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """Push a version the server reads from its own model repository: ``path`` (relative
        to it) names a ``model.onnx``, whose folder's other files come too (a language
        model's tokenizer: the only way to push one)."""
        call = _push_path_call(model, version, path, sha256, activate, mode, rollback)
        return dict(self._send(call))

    def activate(
        self, model: str, version: int, *, mode: str = "at_batch_boundary", rollback: bool = False
    ) -> dict[str, Any]:
        return dict(self._send(_activate_call(model, version, mode, rollback)))

    def rollback(self, model: str, *, version: int | None = None) -> dict[str, Any]:
        """Back to the previous version, or to ``version`` (still loaded, older)."""
        return dict(self._send(_rollback_call(model, version)))

    def hold(self, model: str, *, max_hold_s: float | None = None) -> dict[str, Any]:
        return dict(self._send(_hold_call(model, max_hold_s)))

    def resume(self, model: str) -> dict[str, Any]:
        return dict(self._send(_Call("POST", f"/v1/models/{model}/resume")))

    def model(self, model: str) -> dict[str, Any]:
        return dict(self._send(_Call("GET", f"/v1/models/{model}")))

    def report_episode(
        self,
        model: str,
        *,
        model_version: int,
        episode_return: float,
        length: int | None = None,
        terminated: bool = False,
        truncated: bool = False,
        token: str | None = None,
    ) -> dict[str, Any]:
        """An episode's outcome, for the version that served its steps (every prediction's
        ``model_version``): what a policy canary is judged by (docs/rollouts.md).
        ``token``: the server's ``episode_token``, when it has one."""
        outcome = EpisodeOutcome(model_version, episode_return, length, terminated, truncated)
        call = _episode_call(model, outcome.body(), token)
        return dict(self._send(call))

    def report_episodes(
        self, model: str, outcomes: Sequence[EpisodeOutcome], *, token: str | None = None
    ) -> dict[str, Any]:
        """Several episodes' outcomes in one call (up to 256): a rollout worker's batch."""
        body = {"episodes": [outcome.body() for outcome in outcomes]}
        return dict(self._send(_episode_call(model, body, token)))

    def episodes(self, model: str) -> dict[str, Any]:
        """The model's reported episodes, by version: count, mean return, its spread."""
        return dict(self._send(_Call("GET", f"/v1/models/{model}/episodes")))

    def start_canary(
        self, model: str, version: int, share: float, *, action: str = "report",
        mode: str = "episodes", margin: float | None = None, alpha: float | None = None,
        min_episodes: int | None = None, planned_episodes: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Serve ``share`` of the model's episodes on ``version`` beside the live one, judged
        by the returns reported (docs/rollouts.md); ``action`` "auto" lets the gate promote
        or roll back, "report" leaves it to you; ``mode`` "shadow" serves nothing on it,
        comparing it with the live version on ``share`` of its batches. Needs the admin
        token."""
        gate = {"action": action, "mode": mode, "margin": margin, "alpha": alpha,
                "min_episodes": min_episodes, "planned_episodes": planned_episodes}  # fmt: skip
        return dict(self._send(_canary_call(model, version, share, gate)))

    def canary(self, model: str) -> dict[str, Any]:
        """The model's canary: both versions' returns, the interval and the verdict."""
        return dict(self._send(_Call("GET", f"/v1/models/{model}/canary")))

    def promote_canary(self, model: str) -> dict[str, Any]:
        return dict(self._send(_Call("POST", f"/v1/models/{model}/canary/promote")))

    def rollback_canary(self, model: str) -> dict[str, Any]:
        return dict(self._send(_Call("POST", f"/v1/models/{model}/canary/rollback")))


class AsyncPolicyClient:
    """``httpx_options`` go to ``httpx.AsyncClient`` (limits, transport, TLS settings)."""

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
            call.method, call.path, content=call.body, params=call.params, headers=call.headers
        )
        retry_after = response.headers.get("Retry-After")
        return _result(Answer(response.status_code, response.content, retry_after))

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
        action_masks: Any = None,
        memory: Memory | None = None,
        episode_key: str | None = None,
    ) -> Prediction:
        """``action_masks``: a masked policy's (MaskablePPO); ``memory``: a recurrent
        policy's state, or its server-held sequence; ``episode_key``: the episode every
        call of one episode names, for a model's canary."""
        call = _predict_call(
            observations, model, version, deterministic, seed, outputs, actions, timeout_ms,
            action_masks, memory, episode_key,
        )  # fmt: skip
        return _prediction(await self._send(call))

    async def push(
        self, model: str, version: int, onnx: bytes | Path, *, activate: bool = True,
        mode: str = "at_batch_boundary", rollback: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        return dict(await self._send(_push_call(model, version, onnx, activate, mode, rollback)))

    async def push_from_repository(
        self, model: str, version: int, path: str, sha256: str, *, activate: bool = True,
        mode: str = "at_batch_boundary", rollback: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        call = _push_path_call(model, version, path, sha256, activate, mode, rollback)
        return dict(await self._send(call))

    async def activate(
        self, model: str, version: int, *, mode: str = "at_batch_boundary", rollback: bool = False
    ) -> dict[str, Any]:
        return dict(await self._send(_activate_call(model, version, mode, rollback)))

    async def rollback(self, model: str, *, version: int | None = None) -> dict[str, Any]:
        """Back to the previous version, or to ``version`` (still loaded, older)."""
        return dict(await self._send(_rollback_call(model, version)))

    async def hold(self, model: str, *, max_hold_s: float | None = None) -> dict[str, Any]:
        return dict(await self._send(_hold_call(model, max_hold_s)))

    async def resume(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("POST", f"/v1/models/{model}/resume")))

    async def model(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("GET", f"/v1/models/{model}")))

    async def report_episode(
        self,
        model: str,
        *,
        model_version: int,
        episode_return: float,
        length: int | None = None,
        terminated: bool = False,
        truncated: bool = False,
        token: str | None = None,
    ) -> dict[str, Any]:
        """As ``PolicyClient.report_episode``."""
        outcome = EpisodeOutcome(model_version, episode_return, length, terminated, truncated)
        call = _episode_call(model, outcome.body(), token)
        return dict(await self._send(call))

    async def report_episodes(
        self, model: str, outcomes: Sequence[EpisodeOutcome], *, token: str | None = None
    ) -> dict[str, Any]:
        """As ``PolicyClient.report_episodes``."""
        body = {"episodes": [outcome.body() for outcome in outcomes]}
        return dict(await self._send(_episode_call(model, body, token)))

    async def episodes(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("GET", f"/v1/models/{model}/episodes")))

    async def start_canary(
        self, model: str, version: int, share: float, *, action: str = "report",
        mode: str = "episodes", margin: float | None = None, alpha: float | None = None,
        min_episodes: int | None = None, planned_episodes: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        gate = {"action": action, "mode": mode, "margin": margin, "alpha": alpha,
                "min_episodes": min_episodes, "planned_episodes": planned_episodes}  # fmt: skip
        return dict(await self._send(_canary_call(model, version, share, gate)))

    async def canary(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("GET", f"/v1/models/{model}/canary")))

    async def promote_canary(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("POST", f"/v1/models/{model}/canary/promote")))

    async def rollback_canary(self, model: str) -> dict[str, Any]:
        return dict(await self._send(_Call("POST", f"/v1/models/{model}/canary/rollback")))
