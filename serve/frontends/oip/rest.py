"""The Open Inference Protocol over HTTP (KServe v2 REST), with binary tensor data.

    GET  /v2                                          server metadata
    GET  /v2/health/live                              200 while the process answers
    GET  /v2/health/ready                             200, or 503 with the reasons
    GET  /v2/models/{m}[/versions/{v}]                model metadata (tensors from the contract)
    GET  /v2/models/{m}[/versions/{v}]/ready          200, or 503
    GET  /v2/models/{m}[/versions/{v}]/config         Triton's model configuration (perf_analyzer)
    POST /v2/models/{m}[/versions/{v}]/infer          inference
    POST /v2/repository/index                         the models served
    GET  /v2/systemsharedmemory[/region/{r}]/status   shared-memory regions (allow_client_shm)
    POST /v2/systemsharedmemory/region/{r}/register   {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{r}]/unregister
         /v2/cudasharedmemory/...                     none registered; register refused

An infer body is a JSON header, optionally followed by binary tensor data: when the
``Inference-Header-Content-Length`` header is given, the first that many bytes are JSON and
each input whose ``parameters.binary_data_size`` is set takes its bytes from the rest, in
input order. Outputs requested with ``parameters.binary_data`` (or all outputs, with the
request parameter ``binary_data_output``) are answered the same way. With system shared
memory on (``serve.frontends.oip.shared_memory``), an input or a requested output whose
parameters name a ``shared_memory_region`` is read from or written to that region instead;
such an output is answered with its name, datatype and shape only, no parameters and no
data, as Triton answers it (Triton's C++ client reads any output ``parameters`` as binary
data and fails without ``binary_data_size``). While ``admin_token`` guards shared memory, its
routes and the calls that place a tensor in it need ``Authorization: Bearer <admin_token>``,
as the admin routes do (``SharedMemory.admit``). Errors are
``{"error": message, "code": code}`` with the status ``serve.status`` maps the code to; the
deadline is ``X-Request-Timeout-Ms``, or the request parameter ``timeout`` (microseconds).

Like the JSON predict routes, nothing but uvicorn stands in front of these routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from kernel.errors import (
    InvalidInput,
    MalformedRequest,
    NotFound,
    RLServeError,
    ServiceUnavailable,
    listed,
    quoted,
)
from kernel.json_shown import json_shown
from serve import __version__
from serve.dataplane.deadline import Deadline, budget_ms
from serve.dataplane.messages import InferenceResponse
from serve.dataplane.routing import Route
from serve.dataplane.row_calls import INLINE_BODY_BYTES
from serve.frontends.http_calls import (
    JSON_HEADER,
    Call,
    ErrorAnswer,
    Exchange,
    Headers,
    HttpCalls,
    Responder,
    allow,
    read_body,
    stamp,
    start_call,
    unexpected,
)
from serve.frontends.oip import shared_memory, tensors
from serve.frontends.oip.catalog import PLATFORM, Catalog, extensions, repository_index
from serve.frontends.oip.infer import InferAnswer, Inference, call_budget_ms
from serve.frontends.oip.shared_memory import PlacedInput
from serve.frontends.oip.signature import (
    OUTPUT_PARAMETERS,
    InferCall,
    RequestedOutput,
    Signature,
    config_dims,
)
from serve.frontends.wire import episode_key, refuse_repeated_keys, timeout_header_ms
from serve.status import http_status

log = logging.getLogger("rlserve.oip")

PREFIX = "/v2"
_BINARY = (b"content-type", b"application/octet-stream")
_HEADER_LENGTH = b"inference-header-content-length"
_AUTHORIZATION = b"authorization"
_MAX_LENGTH_DIGITS = 19  # a signed 64-bit integer's: more than any body could be
ROUTES = (
    "the routes are GET /v2, GET /v2/health/live, GET /v2/health/ready, "
    "GET /v2/models/{model}[/versions/{version}][/ready|/config], "
    "POST /v2/models/{model}[/versions/{version}]/infer, POST /v2/repository/index, "
    "GET /v2/systemsharedmemory[/region/{region}]/status, "
    "POST /v2/systemsharedmemory/region/{region}/register and "
    "POST /v2/systemsharedmemory[/region/{region}]/unregister"
)
_SHM_ACTIONS = ("status", "register", "unregister")
_FIXED: dict[tuple[str, ...], str] = {  # paths without a model or region in them, by their parts
    ("health", "live"): "live",
    ("health", "ready"): "server_ready",
    ("repository", "index"): "index",
}
_REGISTER_FIELDS = ("key", "offset", "byte_size")
_REGISTER_BODY_BYTES = 64 * 1024  # a register body is three fields


@dataclass(frozen=True, slots=True)
class V2Path:
    """What a /v2 path names: the model and version (when it names them) and the action."""

    model: str | None
    version: str | None
    action: str  # "", "ready", "config", "infer", "live", "server_ready", "index", "stats",
    # "shm_status", "shm_register", "shm_unregister", and the same with "cuda_" before them
    region: str = ""  # a shared-memory region's name ("": every region)


PREFIXES = (PREFIX,)  # every path match() takes starts with it


def match(path: str) -> V2Path | None:
    """The v2 route a path names, or None for paths outside /v2."""
    if path == PREFIX or path == PREFIX + "/":
        return V2Path(None, None, "")
    if not path.startswith(PREFIX + "/"):
        return None
    parts = path[len(PREFIX) + 1 :].split("/")
    fixed = _FIXED.get(tuple(parts))
    if fixed is not None:
        return V2Path(None, None, fixed)
    if parts[0] == "systemsharedmemory":
        return _shared_memory_path(parts[1:], "shm_")
    if parts[0] == "cudasharedmemory":
        return _shared_memory_path(parts[1:], "cuda_shm_")
    if len(parts) < 2 or parts[0] != "models" or not parts[1]:
        return V2Path(None, None, "unknown")
    model, rest = parts[1], parts[2:]
    version = None
    if len(rest) >= 2 and rest[0] == "versions" and rest[1]:
        version, rest = rest[1], rest[2:]
    if not rest:
        return V2Path(model, version, "")
    if len(rest) == 1 and rest[0] in ("ready", "config", "infer", "stats"):
        return V2Path(model, version, rest[0])
    return V2Path(None, None, "unknown")


def _shared_memory_path(parts: list[str], kind: str) -> V2Path:
    """``status`` or ``unregister`` (every region), or ``region/{name}/{action}``; a region's
    name may hold '/' (the client percent-encodes it, the path arrives decoded). ``kind``:
    the actions' prefix, system or CUDA shared memory."""
    if len(parts) == 1 and parts[0] in ("status", "unregister"):
        return V2Path(None, None, kind + parts[0])
    if len(parts) >= 3 and parts[0] == "region" and parts[-1] in _SHM_ACTIONS:
        region = "/".join(parts[1:-1])
        if region:
            return V2Path(None, None, kind + parts[-1], region)
    return V2Path(None, None, "unknown")


class OipRestFrontend:
    def __init__(
        self,
        catalog: Catalog,
        inference: Inference,
        unready: Callable[[], list[str]],
        calls: HttpCalls,
        max_body_bytes: int,
    ) -> None:
        self.catalog = catalog
        self.inference = inference
        self.unready = unready  # why the server is not ready (draining included); [] = ready
        self.calls = calls  # the call around the infer steps: errors, metrics, access log
        self.max_body_bytes = max_body_bytes
        self._answers: dict[str, Callable[[Scope, V2Path], Any]] = {  # GET routes by action
            "": self._metadata,  # the server's or a model's
            "live": lambda scope, path: {"live": True},
            "server_ready": self._server_ready,
            "ready": self._model_ready,
            "config": lambda scope, path: self._config(self._route(path)),
            "stats": _no_stats,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send, path: V2Path) -> None:
        await self.calls.serve(scope, receive, send, partial(self._handle, path=path), _error)

    async def _handle(self, exchange: Exchange, *, path: V2Path) -> None:
        scope, call = exchange.scope, exchange.call
        if path.action.startswith(("shm_", "cuda_shm_")):
            exchange.metered = False  # not inference calls
            answer = await self._shared_memory(exchange, path)
            await exchange.json(200, answer, [])
            return
        if path.action != "infer":
            exchange.metered = False  # metadata and health: not inference calls
            await exchange.json(200, self._get(scope, path), [])
            return
        allow(scope, "POST")
        route = self._infer_route(call, path)
        call.model, call.version = route.model, route.version.version
        body, headers = await self._infer(scope, call, exchange.receive, route)
        await exchange.answer(200, body, headers)

    # ------------------------------------------------------------------ metadata

    def _get(self, scope: Scope, path: V2Path) -> Any:
        action = path.action
        if action == "unknown":  # whatever the method: no route answers there
            raise _not_a_route(scope)
        if action == "index":
            allow(scope, "POST")
            return self._index()
        allow(scope, "GET")
        answer = self._answers.get(action)
        if answer is None:
            raise _not_a_route(scope)
        return answer(scope, path)

    def _metadata(self, scope: Scope, path: V2Path) -> dict[str, Any]:
        if path.model is None:
            listed = extensions(self.inference.shared_memory.enabled)
            return {"name": "rlserve", "version": __version__, "extensions": listed}
        return self._model_metadata(path)

    async def _shared_memory(self, exchange: Exchange, path: V2Path) -> Any:
        """The system shared-memory routes, and CUDA's as Triton answers them on a host
        without CUDA: none registered, unregistering succeeds, registering is refused."""
        scope, registry = exchange.scope, self.inference.shared_memory
        cuda = path.action.startswith("cuda_")
        action = path.action.removeprefix("cuda_")
        allow(scope, "GET" if action == "shm_status" else "POST")
        if not cuda:  # CUDA's answer nothing a client could use: none is ever registered
            registry.admit(_authorization(scope))
        if action == "shm_status":
            regions = registry.cuda_status(path.region) if cuda else registry.status(path.region)
            return [region.to_json() for region in regions]
        body = await read_body(
            exchange.receive, exchange.call.declared_length, _REGISTER_BODY_BYTES
        )
        if action == "shm_unregister":
            if cuda:
                registry.cuda_unregister(path.region)
            else:
                registry.unregister(path.region)
            return {}
        if cuda:
            raise shared_memory.refuse_cuda()
        given = _register_body(body, path.region)
        registry.register(path.region, given["key"], given.get("offset", 0), given["byte_size"])
        return {}

    def _server_ready(self, scope: Scope, path: V2Path) -> dict[str, Any]:
        reasons = self.unready()
        if reasons:
            raise ServiceUnavailable("not ready: " + "; ".join(reasons))
        return {"ready": True}

    def _model_ready(self, scope: Scope, path: V2Path) -> dict[str, Any]:
        route = self._route(path)
        if route.scheduler.held:
            raise ServiceUnavailable(f"model {route.model!r} is held; resume it to serve it")
        return {"name": route.model, "ready": True}

    def _route(self, path: V2Path) -> Route:
        return self.inference.route(path.model or "", path.version)

    def _infer_route(self, call: Call, path: V2Path) -> Route:
        """An infer call's route: while its model has a canary, the side its episode key
        (``X-Episode-Key``) is assigned to."""
        episode = episode_key(call.episode_header)
        return self.inference.route(path.model or "", path.version, episode)

    def _model_metadata(self, path: V2Path) -> dict[str, Any]:
        route = self.inference.route(path.model or "", path.version)
        signature = self.inference.signature(route.row_model())
        versions = [str(v) for v in self.catalog.versions(route.model)]
        return {
            "name": route.model,
            "versions": versions if path.version is None else [str(route.version.version)],
            "platform": PLATFORM,
            "inputs": [t.to_json() for t in signature.inputs],
            "outputs": [t.to_json() for t in signature.outputs],
            "parameters": {"model_sha256": route.version.sha256},
        }

    def _config(self, route: Route) -> dict[str, Any]:
        """Triton's model configuration, as far as it describes this model: tensors without
        the batch axis (max_batch_size > 0), and the dynamic batcher's settings."""
        signature = self.inference.signature(route.row_model())
        scheduler = route.scheduler.describe()
        return {
            "name": route.model,
            "platform": PLATFORM,
            "backend": "onnxruntime",
            "max_batch_size": scheduler.get("max_batch_size", 0),
            "input": [_config_tensor(t.name, t.datatype, t.shape) for t in signature.inputs],
            "output": [_config_tensor(t.name, t.datatype, t.shape) for t in signature.outputs],
            "dynamic_batching": {
                "max_queue_delay_microseconds": int(scheduler.get("max_wait_ms", 0) * 1000)
            },
            "instance_group": [{"name": route.model, "kind": _kind(route), "count": 1}],
            "version_policy": {"latest": {"num_versions": 1}},
            "parameters": {"model_sha256": {"string_value": route.version.sha256}},
        }

    def _index(self) -> list[dict[str, Any]]:
        return [
            {"name": e.name, "version": e.version, "state": e.state}
            | ({"reason": e.reason} if e.reason else {})
            for e in repository_index(self.catalog)
        ]

    # ------------------------------------------------------------------ infer

    async def _infer(
        self, scope: Scope, call: Call, receive: Receive, route: Route
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        header_length = _header_length(scope)
        body = await read_body(receive, call.declared_length, self.max_body_bytes)
        self._admit(call, route)
        decoded, budget = await self.inference.calls.prepare(
            len(body),
            lambda _: decode_infer(body, header_length, call, route.default_deadline_ms),
        )
        deadline = self._deadline(scope, call, decoded, budget)
        answer = await self.inference.run(
            route, decoded, call.request_id, call.received_at, deadline
        )
        return encode_infer(answer, decoded)

    def _admit(self, call: Call, route: Route) -> None:
        """Refused now (429, 504) when the model could not serve the call in time."""
        calls = self.inference.calls
        asked = budget_ms(route.default_deadline_ms, timeout_header_ms(call.timeout_header))
        calls.admit(route, calls.turn.deadline(call.received_at, asked), spent_on="reading it")

    def _deadline(self, scope: Scope, call: Call, decoded: InferCall, budget: float) -> Deadline:
        """The call's deadline (its timeout parameter may ask for less than its header);
        a call that reads or writes shared memory must be allowed to."""
        if decoded.in_shared_memory:
            self.inference.shared_memory.admit(_authorization(scope))
        deadline = self.inference.calls.turn.deadline(call.received_at, budget)
        deadline.check("reading it")
        return deadline

    def answer_now(self, scope: Scope, body: bytes, responder: Responder, path: V2Path) -> bool:
        """An infer call answered without a task (``RouteEntry.now``): ``_infer``'s steps
        where none waits, the answer written when the batch is done. False (the task
        answers) for every other route and for a call too large to decode on the loop or
        naming entities."""
        limit = min(INLINE_BODY_BYTES, self.max_body_bytes)
        if path.action != "infer" or scope["method"] != "POST" or len(body) > limit:
            return False
        call = start_call(scope)
        try:
            route = self._infer_route(call, path)
            call.model, call.version = route.model, route.version.version
            self._admit(call, route)
            header_length = _header_length(scope)
            decoded, budget = decode_infer(body, header_length, call, route.default_deadline_ms)
            deadline = self._deadline(scope, call, decoded, budget)
            queued = self.inference.queue(
                route, decoded, call.request_id, call.received_at, deadline
            )
            if queued is None:
                return False
        except RLServeError as exc:
            self.calls.refuse_now(responder, scope, call, exc, _error)
        except Exception as exc:
            self.calls.refuse_now(responder, scope, call, unexpected(scope, exc), _error)
        else:
            future, signature = queued
            answered = partial(self._answered, scope, call, responder, decoded, signature)
            future.add_done_callback(answered)
        return True

    def _answered(
        self,
        scope: Scope,
        call: Call,
        responder: Responder,
        decoded: InferCall,
        signature: Signature,
        future: asyncio.Future[InferenceResponse],
    ) -> None:
        """An infer call answered without a task: its batch is done."""

        def answer() -> tuple[int, Headers, bytes]:
            tensors = self.inference.answer(decoded, signature, future.result())
            body, headers = encode_infer(tensors, decoded)
            return 200, headers, body

        self.calls.settle_now(responder, scope, call, answer, _error)


def _register_body(body: bytes, region: str) -> dict[str, Any]:
    try:
        given = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(
            f"register {quoted(region)}: the body does not parse: {exc}"
        ) from None
    refuse_repeated_keys(body, given)
    if not isinstance(given, dict) or "key" not in given or "byte_size" not in given:
        raise InvalidInput(
            f'register {quoted(region)}: expected {{"key": shm name, "offset": bytes, '
            f'"byte_size": bytes}} (offset optional, 0)'
        )
    unknown = sorted(set(given) - set(_REGISTER_FIELDS))
    if unknown:
        raise InvalidInput(
            f"register {quoted(region)}: unknown field(s) {listed(unknown)}; a register body "
            f"has {list(_REGISTER_FIELDS)}"
        )
    return given


def _no_stats(scope: Scope, path: V2Path) -> Any:
    raise NotFound(
        f"{quoted(scope['path'])}: statistics are served as Prometheus metrics at /metrics"
    )


def _not_a_route(scope: Scope) -> NotFound:
    return NotFound(f"{quoted(scope['path'])}: not an Open Inference Protocol route; {ROUTES}")


def _error(error: RLServeError) -> ErrorAnswer:
    """The protocol's error body: ``{"error": message, "code": code}``."""
    return ErrorAnswer(http_status(error), {"error": error.message, "code": error.code.value})


def _config_tensor(name: str, datatype: str, shape: tuple[int, ...]) -> dict[str, Any]:
    dims, scalar = config_dims(shape)
    tensor: dict[str, Any] = {"name": name, "data_type": "TYPE_" + datatype, "dims": dims}
    if scalar:
        tensor["reshape"] = {"shape": []}
    return tensor


def _kind(route: Route) -> str:
    return "KIND_CPU" if route.version.provider == "CPUExecutionProvider" else "KIND_GPU"


def _authorization(scope: Scope) -> str:
    """The call's ``Authorization`` header ("" when it has none)."""
    for name, value in scope["headers"]:
        if name == _AUTHORIZATION:
            return value.decode("latin-1")
    return ""


def _header_length(scope: Scope) -> int | None:
    """The ``Inference-Header-Content-Length`` a call gives (None: the body is all JSON),
    with every header read, whatever their order: given twice, or with a Content-Encoding
    this server does not decode, the call is refused (400)."""
    given = [value for name, value in scope["headers"] if name == _HEADER_LENGTH]
    for name, value in scope["headers"]:
        if name == b"content-encoding" and value not in (b"identity", b""):
            raise MalformedRequest(
                f"Content-Encoding {quoted(value.decode('latin-1'))} is not supported; send "
                "the body uncompressed"
            )
    if not given:
        return None
    if len(given) > 1:
        raise MalformedRequest(
            f"Inference-Header-Content-Length is given {len(given)} times; give it once, the "
            "JSON header's length in bytes"
        )
    value = given[0]
    if not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
        raise MalformedRequest(
            "Inference-Header-Content-Length: expected the JSON header's length in bytes "
            f"(at most {_MAX_LENGTH_DIGITS} digits), got {quoted(value.decode('latin-1'))}"
        )
    return int(value)


# --------------------------------------------------------------------------- wire format


def decode_infer(
    body: bytes, header_length: int | None, call: Call, default_ms: float
) -> tuple[InferCall, float]:
    """An infer body as a call, and the call's deadline budget in milliseconds."""
    if header_length is None:
        header, binary = body, memoryview(b"")
    elif header_length > len(body):
        raise MalformedRequest(
            f"Inference-Header-Content-Length is {header_length}, but the body has only "
            f"{len(body)} bytes"
        )
    else:
        view = memoryview(body)
        header, binary = bytes(view[:header_length]), view[header_length:]
    try:
        payload = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"infer request: the JSON header does not parse: {exc}") from None
    if not isinstance(payload, dict):
        raise MalformedRequest(
            'infer request: expected a JSON object like {"inputs": [{"name", "datatype", '
            f'"shape", "data"}}]}}, got a JSON {type(payload).__name__}'
        )
    refuse_repeated_keys(header, payload)
    parameters = _object(payload.get("parameters"), "parameters")
    inputs, placed = _inputs(
        payload.get("inputs"), binary, may_hold_booleans=b"true" in header or b"false" in header
    )
    outputs = _outputs(payload.get("outputs"))
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise InvalidInput(
            "parameters.binary_data_output: expected true or false, got "
            f"{json_shown(binary_output)}"
        )
    request_id = payload.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput(f"id: expected a string, got {json_shown(request_id)}")
    decoded = InferCall(inputs, parameters, outputs, request_id, binary_output, placed=placed)
    return decoded, call_budget_ms(decoded, default_ms, timeout_header_ms(call.timeout_header))


def _object(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{field}: expected an object, got {type(value).__name__}")
    return value


def _inputs(
    value: Any, binary: memoryview, *, may_hold_booleans: bool
) -> tuple[dict[str, Any], list[PlacedInput]]:
    if not isinstance(value, list):  # empty: a call by entity (its parameter) may be
        raise InvalidInput('inputs: expected a list of {"name", "datatype", "shape", "data"}')
    arrays = {}
    placed: list[PlacedInput] = []
    offset = 0  # into the binary data: each input's bytes follow the previous one's
    for i, given in enumerate(value):
        name, datatype, shape = _described(i, given)
        if name in arrays or any(p.name == name for p in placed):
            raise InvalidInput(f"inputs: {quoted(name)} is given twice")
        parameters = _object(given.get("parameters"), f"inputs[{i}].parameters")
        size = parameters.get("binary_data_size")
        where = shared_memory.placement(parameters, "input", name)
        if where is not None:
            if size is not None or "data" in given:
                raise InvalidInput(
                    f"input {quoted(name)}: give its data one way: data, binary_data_size "
                    "and the bytes, or a shared-memory region"
                )
            placed.append(PlacedInput(name, datatype, shape, where))
            continue
        if size is None:
            if "data" not in given:
                raise InvalidInput(
                    f"input {quoted(name)}: give its data, or binary_data_size and the bytes"
                )
            arrays[name] = tensors.from_json(
                name, datatype, shape, given["data"], may_hold_booleans=may_hold_booleans
            )
            continue
        _check_binary_size(name, size, len(binary) - offset)
        arrays[name] = tensors.from_bytes(name, datatype, shape, binary[offset : offset + size])
        offset += size
    if offset != len(binary):
        raise InvalidInput(
            f"the body has {len(binary) - offset} bytes of binary data that no input's "
            "binary_data_size accounts for"
        )
    return arrays, placed


def _described(i: int, given: Any) -> tuple[str, str, list[Any]]:
    """An input's name, datatype and shape, each of its JSON type."""
    if not isinstance(given, dict):
        raise InvalidInput(f"inputs[{i}]: expected an object, got {type(given).__name__}")
    name, datatype, shape = given.get("name"), given.get("datatype"), given.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
        raise InvalidInput(
            f"inputs[{i}]: needs name (string), datatype (string) and shape (list of integers)"
        )
    return name, datatype, shape


def _check_binary_size(name: str, size: Any, left: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(
            f"input {quoted(name)}: binary_data_size must be a byte count, got {json_shown(size)}"
        )
    if size > left:
        raise InvalidInput(
            f"input {quoted(name)}: binary_data_size {size} runs past the end of the body "
            f"({left} bytes of binary data left)"
        )


def _outputs(value: Any) -> list[RequestedOutput]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput('outputs: expected a list of {"name", "parameters"}')
    outputs = []
    for i, given in enumerate(value):
        if not isinstance(given, dict) or not isinstance(given.get("name"), str):
            raise InvalidInput(f"outputs[{i}]: expected an object with a name")
        parameters = _object(given.get("parameters"), f"outputs[{i}].parameters")
        unknown = sorted(parameters.keys() - OUTPUT_PARAMETERS)
        if unknown:
            raise InvalidInput(
                f"outputs[{i}].parameters: {unknown} not supported; an output takes binary_data "
                f"or {list(shared_memory.PARAMETERS)}"
            )
        binary = parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidInput(f"outputs[{i}].parameters.binary_data: expected true or false")
        where = shared_memory.placement(parameters, "output", given["name"])
        if where is not None and binary:
            raise InvalidInput(
                f"output {quoted(given['name'])}: binary_data true and a shared-memory region; "
                "choose one"
            )
        outputs.append(RequestedOutput(given["name"], binary, where))
    return outputs


def encode_infer(answer: InferAnswer, call: InferCall) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The infer answer's body and headers: JSON, then the binary outputs' bytes if any."""
    response = answer.response
    outputs = []
    chunks = []
    for tensor in answer.tensors:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.values.shape),
        }
        if tensor.placement is not None:
            pass  # written to shared memory already (Inference.run): named, not carried
        elif tensor.binary:
            raw = tensors.to_bytes(tensor.values)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = tensors.to_json(tensor.values)
        outputs.append(entry)
    header = {
        "model_name": response.model,
        "model_version": str(response.version),
        "parameters": {"model_sha256": response.sha256},
        "outputs": outputs,
    }
    if call.id:
        header["id"] = call.id
    encoded = orjson.dumps(header)
    stamped = stamp(response.version, response.sha256)
    if not chunks:
        return encoded, [JSON_HEADER, *stamped]
    length = (_HEADER_LENGTH, str(len(encoded)).encode())
    return b"".join([encoded, *chunks]), [_BINARY, length, *stamped]
