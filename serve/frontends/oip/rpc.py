"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService``.

Served by grpcio's asyncio server on the process's event loop, beside HTTP: an infer call
is decoded into an :class:`~serve.frontends.oip.signature.InferCall` and run by the same
:class:`~serve.frontends.oip.infer.Inference` as the REST routes, so gRPC rows share
batches with every other protocol. Tensors come in ``raw_input_contents`` (or typed
``contents``) and always go out in ``raw_output_contents``. A call's gRPC deadline is its
request deadline (never more than the model's ``default_deadline_ms``); errors become the
status ``serve.status.GRPC_STATUS`` maps their code to, with the code and ``retry-after``
in the trailing metadata, and their message cut to fit grpc's metadata limit
(``status_message``).

``ModelStreamInfer`` keeps one stream open for many calls (an actor stepping its
environments): each call on it is run as it arrives, answered when its batch is done (not
necessarily in order: match answers by ``id``), and a call that fails is answered with its
``error_message`` while the stream goes on. A stream holds at most
``grpc_stream_max_in_flight`` calls read and not yet answered (answers waiting for the
client to read them count): at the bound it is not read, and grpc's flow control holds the
client back. At shutdown a stream takes no new calls, answers those in flight and ends.

With system shared memory on (``serve.frontends.oip.shared_memory``), the
``SystemSharedMemory*`` RPCs register, list and unregister regions, and an input or requested
output whose parameters name a ``shared_memory_region`` is read from or written to it: such an
input has no entry in ``raw_input_contents`` (as tritonclient sends it), and such an output is
answered in its place among the others with an empty ``raw_output_contents`` entry, as Triton
answers it: every output has an entry at its own index (Triton's C++ client reads entry i for
output i without looking at the count). While ``admin_token`` guards shared memory, those RPCs
and the calls that place a tensor in it need the ``authorization`` metadata ``Bearer
<admin_token>`` (tritonclient's ``headers=``; a stream's, for its calls). The
``CudaSharedMemory*`` RPCs answer as Triton does on a host without CUDA: no region
registered, unregistering succeeds, registering is refused.

``grpc.health.v1.Health`` answers SERVING while the server is ready (Kubernetes' gRPC
probe asks it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kernel.errors import ConfigError, InvalidInput, RLServeError, internal_error, listed, quoted
from kernel.json_shown import json_shown
from serve import __version__
from serve.dataplane.deadline import Deadline
from serve.dataplane.routing import Route
from serve.frontends.oip import shared_memory, tensors
from serve.frontends.oip.catalog import PLATFORM, Catalog, extensions, repository_index
from serve.frontends.oip.infer import InferAnswer, Inference
from serve.frontends.oip.proto import inference_pb2 as pb
from serve.frontends.oip.proto import inference_pb2_grpc as pb_grpc
from serve.frontends.oip.proto import model_config_pb2 as config_pb
from serve.frontends.oip.shared_memory import PlacedInput
from serve.frontends.oip.signature import (
    EPISODE_KEY,
    OUTPUT_PARAMETERS,
    InferCall,
    RequestedOutput,
    config_dims,
)
from serve.frontends.oip.stream import InferStream
from serve.frontends.wire import episode_key
from serve.status import grpc_status, grpc_trailers

log = logging.getLogger("rlserve.grpc")
T = TypeVar("T")

# The longest error message a status carries, in bytes as grpc sends it: well inside the
# 8 KiB of metadata grpc's clients take without refusing some answers.
STATUS_MESSAGE_BYTES = 2048

# Typed contents by datatype: the InferTensorContents field that carries it.
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        catalog: Catalog,
        inference: Inference,
        unready: Callable[[], list[str]],
        *,
        stream_max_in_flight: int,
    ) -> None:
        self.catalog = catalog
        self.inference = inference
        self.unready = unready
        self.stream_max_in_flight = stream_max_in_flight  # calls read but not yet answered
        self._readers: set[asyncio.Task[None]] = set()  # each open stream's reading task

    # ------------------------------------------------------------------ health, metadata

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=not self.unready())

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            route = self.inference.route(request.name, request.version)
        except RLServeError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=not route.scheduler.held)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        listed = extensions(self.inference.shared_memory.enabled)
        return pb.ServerMetadataResponse(name="rlserve", version=__version__, extensions=listed)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        route = await self._route(request.name, request.version, context)
        signature = self.inference.signature(route.row_model())
        versions = (
            self.catalog.versions(route.model) if not request.version else [route.version.version]
        )
        metadata = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=route.model,
            versions=[str(v) for v in versions],
            platform=PLATFORM,
            inputs=[
                metadata(name=t.name, datatype=t.datatype, shape=t.shape) for t in signature.inputs
            ],
            outputs=[
                metadata(name=t.name, datatype=t.datatype, shape=t.shape) for t in signature.outputs
            ],
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        route = await self._route(request.name, request.version, context)
        signature = self.inference.signature(route.row_model())
        scheduler = route.scheduler.describe()
        return pb.ModelConfigResponse(
            config=config_pb.ModelConfig(
                name=route.model,
                platform=PLATFORM,
                backend="onnxruntime",
                max_batch_size=scheduler.get("max_batch_size", 0),
                input=[
                    _config_tensor(config_pb.ModelInput, t.name, t.datatype, t.shape)
                    for t in signature.inputs
                ],
                output=[
                    _config_tensor(config_pb.ModelOutput, t.name, t.datatype, t.shape)
                    for t in signature.outputs
                ],
                dynamic_batching=config_pb.ModelDynamicBatching(
                    max_queue_delay_microseconds=int(scheduler.get("max_wait_ms", 0) * 1000)
                ),
            )
        )

    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "statistics are served as Prometheus metrics at the HTTP port's /metrics",
        )

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[
                index(name=e.name, version=e.version, state=e.state, reason=e.reason)
                for e in repository_index(self.catalog)
            ]
        )

    # ------------------------------------------------------------------ shared memory

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        regions = await _answered(context, lambda: self._admitted(context).status(request.name))
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(
            regions={
                r.name: status(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size)
                for r in regions
            }
        )

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        await _answered(
            context,
            lambda: self._admitted(context).register(
                request.name, request.key, request.offset, request.byte_size
            ),
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        await _answered(context, lambda: self._admitted(context).unregister(request.name))
        return pb.SystemSharedMemoryUnregisterResponse()

    def _admitted(self, context: Any) -> shared_memory.SharedMemory:
        """The registry, once the caller may use it (``SharedMemory.admit``)."""
        registry = self.inference.shared_memory
        registry.admit(_authorization(context))
        return registry

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        await _answered(context, lambda: self.inference.shared_memory.cuda_status(request.name))
        return pb.CudaSharedMemoryStatusResponse()  # none registered

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:  # noqa: N802
        await _abort(context, shared_memory.refuse_cuda())

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:  # noqa: N802
        await _answered(context, lambda: self.inference.shared_memory.cuda_unregister(request.name))
        return pb.CudaSharedMemoryUnregisterResponse()

    async def _route(self, model: str, version: str, context: Any) -> Route:
        try:
            return self.inference.route(model, version)
        except RLServeError as exc:
            await _abort(context, exc)
            raise  # abort raises; this keeps the type checker informed

    # ------------------------------------------------------------------ infer

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        received_at = time.monotonic()
        remaining = context.time_remaining()
        try:
            return await self._infer(request, received_at, remaining, context)
        except RLServeError as exc:
            await _abort(context, exc)

    async def ModelStreamInfer(  # type: ignore[override]  # noqa: N802
        self, requests: Any, context: Any
    ) -> None:
        """Read calls as they come and start each at once; answers are written as their
        batches finish (``serve.frontends.oip.stream``). At shutdown (``close_streams``)
        the reading stops: the calls in flight are answered and the stream ends."""
        remaining = context.time_remaining()
        stream_ends = None if remaining is None else time.monotonic() + remaining
        waiting: set[asyncio.Task[None]] = set()  # calls with a step that waits

        def start(request: Any, received_at: float, reply: Callable[[Any], None]) -> None:
            left = None if stream_ends is None else stream_ends - received_at
            task = self._stream_call(request, received_at, left, context, reply)
            if task is not None:
                waiting.add(task)
                task.add_done_callback(waiting.discard)

        stream = InferStream(context, self.stream_max_in_flight)
        reader = asyncio.create_task(stream.read(requests, start))
        self._readers.add(reader)
        try:
            await stream.write()  # ends once the reading ended and every call is answered
        finally:
            self._readers.discard(reader)
            reader.cancel()
            for task in waiting:
                task.cancel()

    def _stream_call(
        self,
        request: Any,
        received_at: float,
        remaining_s: float | None,
        context: Any,
        reply: Callable[[Any], None],
    ) -> asyncio.Task[None] | None:
        """Start one stream call: its steps now, its reply (``reply``) once its batch is
        done, from the batch's future; a call with a step that waits (entities, large
        tensors) runs in the task returned."""
        route: Route | None = None
        try:
            route = self._routed(request)
            call, deadline = self._call_admitted(route, request, received_at, remaining_s, context)
            queued = self.inference.queue(route, call, request.id, received_at, deadline)
        except Exception as exc:
            reply(_stream_error(request, self._refused(route, exc, received_at, request)))
            return None
        if queued is None:
            running = self._infer(request, received_at, remaining_s, context)
            return asyncio.create_task(_replied(running, request, reply))
        future, signature = queued

        def settled(done: asyncio.Future[Any]) -> None:
            try:
                answer = self.inference.answer(call, signature, done.result())
                message = pb.ModelStreamInferResponse()
                fill_infer(message.infer_response, answer, call)
                reply(message)
            except BaseException as exc:  # a cancelled batch too: the one internal error
                reply(_stream_error(request, self._refused(route, exc, received_at, request)))

        future.add_done_callback(settled)
        return None

    def close_streams(self) -> None:
        """Shutdown: every stream stops reading, answers its calls in flight and ends."""
        for reader in self._readers:
            reader.cancel()

    async def _infer(
        self, request: Any, received_at: float, remaining_s: float | None, context: Any
    ) -> Any:
        """One call run (``context``: its own, or its stream's, whose metadata a call placing
        a tensor in shared memory is admitted by)."""
        route: Route | None = None
        try:
            route = self._routed(request)
            call, deadline = self._call_admitted(route, request, received_at, remaining_s, context)
            answer = await self.inference.run(route, call, request.id, received_at, deadline)
        except Exception as exc:
            raise self._refused(route, exc, received_at, request) from None
        return encode_infer(answer, call)

    def _routed(self, request: Any) -> Route:
        episode = _episode_key(request.parameters)
        return self.inference.route(request.model_name, request.model_version, episode)

    def _call_admitted(
        self,
        route: Route,
        request: Any,
        received_at: float,
        remaining_s: float | None,
        context: Any,
    ) -> tuple[InferCall, Deadline]:
        """The call decoded, and its deadline once admission lets it in."""
        call = decode_infer(request)
        if call.in_shared_memory:
            self.inference.shared_memory.admit(_authorization(context))
        asked_ms = None if remaining_s is None else remaining_s * 1000
        return call, self.inference.admitted(route, call, received_at, asked_ms)

    def _refused(
        self, route: Route | None, exc: BaseException, received_at: float, request: Any
    ) -> RLServeError:
        """A call's failure, counted: its RLServeError, or, for a bug of ours (logged), the
        one internal error."""
        if not isinstance(exc, RLServeError):
            log.exception("unhandled error on ModelInfer for %r", request.model_name, exc_info=exc)
            exc = internal_error(exc)
        self.inference.refused(route, exc, received_at)
        return exc


async def _replied(running: Awaitable[Any], request: Any, reply: Callable[[Any], None]) -> None:
    """A stream call run in a task of its own: its response, or its error naming the call."""
    try:
        response = await running
    except RLServeError as exc:  # the stream goes on; the reply names the call
        reply(_stream_error(request, exc))
    else:
        reply(pb.ModelStreamInferResponse(infer_response=response))


def _stream_error(request: Any, error: RLServeError) -> Any:
    """A stream call's error answer: the stream goes on, and the answer names the call."""
    return pb.ModelStreamInferResponse(
        error_message=status_message(f"[{error.code.value}] {error.message}"),
        infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )


def _authorization(context: Any) -> str:
    """The call's ``authorization`` metadata ("" when it has none); gRPC sends metadata keys
    in lower case."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else bytes(value).decode("latin-1")
    return ""


async def _answered(context: Any, call: Callable[[], T]) -> T:
    """What ``call`` returns; its RLServeError becomes the call's status."""
    try:
        return call()
    except RLServeError as exc:
        await _abort(context, exc)
        raise  # abort raises; this keeps the type checker informed


async def _abort(context: Any, error: RLServeError) -> None:
    context.set_trailing_metadata(grpc_trailers(error))
    await context.abort(grpc_status(error), status_message(error.message))


def status_message(message: str) -> str:
    """``message`` cut to fit the status it travels in: at most ``STATUS_MESSAGE_BYTES`` as
    grpc sends it (percent-encoded in the ``grpc-message`` trailer, which grpc's clients
    refuse beyond 8 to 16 KiB of metadata, answering ``RESOURCE_EXHAUSTED`` instead of the
    error's own status), with a note of how much was cut."""
    message = message.encode("utf-8", "replace").decode("utf-8")  # lone surrogates: '?'
    if _wire_bytes(message) <= STATUS_MESSAGE_BYTES:
        return message
    kept: list[str] = []
    used = 0
    budget = STATUS_MESSAGE_BYTES - _wire_bytes(_cut_note(len(message), len(message)))
    for character in message[:budget]:  # a character takes one byte on the wire, or more
        used += _wire_bytes(character)
        if used > budget:
            break
        kept.append(character)
    return "".join(kept) + _cut_note(len(message) - len(kept), len(message))


def _cut_note(cut: int, total: int) -> str:
    return f"… ({cut:,} of its {total:,} characters cut)"


def _wire_bytes(text: str) -> int:
    """Bytes ``text`` takes in ``grpc-message``: printable ASCII but ``%`` as is, every other
    byte of its UTF-8 as ``%XX``."""
    encoded = text.encode("utf-8")
    plain = sum(1 for byte in encoded if 0x20 <= byte <= 0x7E and byte != 0x25)
    return plain + 3 * (len(encoded) - plain)


# --------------------------------------------------------------------------- messages


def decode_infer(request: Any) -> InferCall:
    parameters = _parameters(request.parameters) if request.parameters else {}
    if "binary_data_output" in parameters:  # as over REST, though answers here always go raw
        _boolean("parameters.binary_data_output", parameters["binary_data_output"])
    arrays, placed = _arrays(request)
    return InferCall(arrays, parameters, _outputs(request), request.id, placed=placed)


def _episode_key(parameters: Any) -> str | None:
    """The ``episode_key`` parameter: the episode a model's canary assigns to a version."""
    if EPISODE_KEY not in parameters:
        return None
    given = parameters[EPISODE_KEY]
    if given.WhichOneof("parameter_choice") != "string_param":
        raise InvalidInput(
            f"parameters.{EPISODE_KEY}: expected a string_param (the episode or client key "
            "every call of one episode names)"
        )
    return episode_key(given.string_param, f"parameters.{EPISODE_KEY}")


def _parameters(given: Any) -> dict[str, Any]:
    return {key: _parameter(value) for key, value in given.items()}


def _arrays(request: Any) -> tuple[dict[str, np.ndarray], list[PlacedInput]]:
    """The inputs given in the call, and those in shared memory (no raw entry of their own)."""
    raw = request.raw_input_contents
    if raw and not any(given.parameters for given in request.inputs):
        return _raw_arrays(request, raw), []  # the usual call: every input's bytes in raw
    placements = [
        shared_memory.placement(_parameters(given.parameters), "input", given.name)
        for given in request.inputs
    ]
    carried = sum(where is None for where in placements)
    if raw and len(raw) != carried:
        raise _raw_count(len(raw), carried)
    arrays: dict[str, np.ndarray] = {}
    placed: list[PlacedInput] = []
    entries = iter(raw)
    for given, where in zip(request.inputs, placements, strict=True):
        if given.name in arrays or any(p.name == given.name for p in placed):
            raise _given_twice(given.name)
        shape = list(given.shape)
        if (raw or where is not None) and given.HasField("contents"):
            raise _two_ways(given.name)
        if where is not None:
            placed.append(PlacedInput(given.name, given.datatype, shape, where))
        elif raw:
            arrays[given.name] = tensors.from_bytes(
                given.name, given.datatype, shape, next(entries)
            )
        else:
            arrays[given.name] = _from_contents(given, shape)
    return arrays, placed


def _raw_arrays(request: Any, raw: Any) -> dict[str, np.ndarray]:
    """Inputs without parameters (none in shared memory), each with its raw entry."""
    if len(raw) != len(request.inputs):
        raise _raw_count(len(raw), len(request.inputs))
    arrays: dict[str, np.ndarray] = {}
    for given, data in zip(request.inputs, raw, strict=True):
        name = given.name
        if name in arrays:
            raise _given_twice(name)
        if given.HasField("contents"):
            raise _two_ways(name)
        arrays[name] = tensors.from_bytes(name, given.datatype, list(given.shape), data)
    return arrays


def _raw_count(entries: int, carried: int) -> InvalidInput:
    return InvalidInput(
        f"raw_input_contents: {entries} entries for {carried} inputs not in shared memory; "
        "give one per such input, in input order, or none and use contents"
    )


def _given_twice(name: str) -> InvalidInput:
    return InvalidInput(f"inputs: {quoted(name)} is given twice")


def _two_ways(name: str) -> InvalidInput:
    return InvalidInput(
        f"input {quoted(name)}: give its data one way: in raw_input_contents, in contents or "
        "in shared memory"
    )


def _outputs(request: Any) -> list[RequestedOutput]:
    outputs = []
    for output in request.outputs:
        if not output.parameters:  # the usual output: answered in raw_output_contents
            outputs.append(RequestedOutput(output.name))
            continue
        parameters = _parameters(output.parameters)
        unknown = sorted(parameters.keys() - OUTPUT_PARAMETERS)
        if unknown:
            raise InvalidInput(
                f"outputs: {quoted(output.name)} parameters {listed(unknown)} are not supported; "
                f"an output takes binary_data or {list(shared_memory.PARAMETERS)}"
            )
        binary = parameters.get("binary_data")  # accepted, and changes nothing: answers go raw
        if binary is not None:
            _boolean(f"outputs: {quoted(output.name)} parameters.binary_data", binary)
        where = shared_memory.placement(parameters, "output", output.name)
        outputs.append(RequestedOutput(output.name, None, where))
    return outputs


def _boolean(field: str, value: Any) -> None:
    """The binary data switches must be booleans, as over REST (which answers 422)."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{field}: expected true or false, got {json_shown(value)}")


def _from_contents(given: Any, shape: list[int]) -> np.ndarray:
    field = _CONTENTS.get(given.datatype)
    if field is None:
        tensors.dtype_of(given.datatype, given.name)  # names the datatypes that are taken
        raise InvalidInput(
            f"input {quoted(given.name)}: {given.datatype} data goes in raw_input_contents"
        )
    values = getattr(given.contents, field)
    return tensors.from_json(
        given.name, given.datatype, shape, list(values), may_hold_booleans=False
    )


def _parameter(value: Any) -> Any:
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


def encode_infer(answer: InferAnswer, call: InferCall) -> Any:
    """The answer as a ``ModelInferResponse``."""
    response = pb.ModelInferResponse()
    fill_infer(response, answer, call)
    return response


def fill_infer(target: Any, answer: InferAnswer, call: InferCall) -> None:
    """Write the answer into the empty ``ModelInferResponse`` ``target`` (a stream's
    answer fills its own in place: no copy): every output with its
    ``raw_output_contents`` entry at the same index, empty for an output written to
    shared memory."""
    response = answer.response
    target.model_name = response.model
    target.model_version = str(response.version)
    target.id = call.id
    target.parameters["model_sha256"].string_param = response.sha256
    outputs, contents = target.outputs, target.raw_output_contents
    for tensor in answer.tensors:
        outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.values.shape)
        contents.append(b"" if tensor.placement is not None else tensors.to_bytes(tensor.values))


def _data_type(datatype: str) -> Any:
    return config_pb.DataType.Value("TYPE_" + datatype)


def _config_tensor(kind: Any, name: str, datatype: str, shape: tuple[int, ...]) -> Any:
    """A ``ModelInput`` or ``ModelOutput`` (``kind``) of the model configuration."""
    dims, scalar = config_dims(shape)
    reshape = config_pb.ModelTensorReshape(shape=[]) if scalar else None
    return kind(name=name, data_type=_data_type(datatype), dims=dims, reshape=reshape)


class HealthService(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health``: SERVING while the server is ready (any service name)."""

    def __init__(self, unready: Callable[[], list[str]]) -> None:
        self.unready = unready

    async def Check(self, request: Any, context: Any) -> Any:  # noqa: N802
        status = health_pb2.HealthCheckResponse
        return status(status=status.NOT_SERVING if self.unready() else status.SERVING)


class GrpcServer:
    """The gRPC listener of one server process: started with the app, stopped in its
    lifespan shutdown before the schedulers (``serve.process.phases``)."""

    def __init__(
        self, service: InferenceService, health: HealthService, address: str, max_message_bytes: int
    ) -> None:
        self.service = service
        self.health = health
        self.address = address
        self.options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 1),  # every gunicorn worker listens on the same port
        ]
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        """Listen, on the running event loop (grpcio binds its server to the loop that
        creates it)."""
        server = grpc.aio.server(options=self.options)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            self.port = server.add_insecure_port(self.address)
        except RuntimeError as exc:  # grpcio raises this when it cannot bind
            raise ConfigError(
                f"grpc_port: cannot listen for gRPC on {self.address}: {exc}"
            ) from None
        await server.start()
        self.server = server
        log.info("gRPC listening on %s", self.address)

    async def stop(self, grace_s: float) -> None:
        """Take no new calls; calls in flight (streams: their calls in flight) finish
        within ``grace_s``."""
        self.service.close_streams()
        if self.server is not None:
            await self.server.stop(grace_s)
