"""Our gRPC definitions of the Open Inference Protocol (serve/frontends/oip/proto) against
Triton's, as tritonclient ships them compiled: the same rpcs, the same field numbers, names and
types, and messages that cross between the two unchanged in either direction."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as triton_config
from tritonclient.grpc import service_pb2 as triton_service
from tritonclient.grpc import service_pb2_grpc as triton_grpc

from serve.frontends.oip.proto import generate, inference_pb2, inference_pb2_grpc, model_config_pb2

SERVICE = "inference.GRPCInferenceService"
OUR_RPCS = {
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "ModelStreamInfer",
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
}

# (service module, model-config module): every builder below runs against both sides.
Side = tuple[ModuleType, ModuleType]
OURS: Side = (inference_pb2, model_config_pb2)
TRITON: Side = (triton_service, triton_config)


def test_the_checked_in_generated_files_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("grpc_tools")
    status = generate.main(["--check"])
    assert status == 0, capsys.readouterr().out


def test_our_messages_live_outside_the_default_pool_that_tritonclient_uses() -> None:
    # The same full names in one process: ours in a private pool, Triton's in the default one.
    assert inference_pb2.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
    assert inference_pb2.DESCRIPTOR.pool is not descriptor_pool.Default()
    assert model_config_pb2.DESCRIPTOR.pool is inference_pb2.DESCRIPTOR.pool
    assert triton_service.DESCRIPTOR.pool is descriptor_pool.Default()


# --- descriptors -------------------------------------------------------------------------------


def test_every_rpc_we_declare_is_tritons_with_the_same_types_and_streaming() -> None:
    ours = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == SERVICE
    assert {method.name for method in ours.methods} == OUR_RPCS
    for method in ours.methods:
        twin = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == twin.input_type.full_name, method.name
        assert method.output_type.full_name == twin.output_type.full_name, method.name
        assert method.client_streaming == twin.client_streaming, method.name
        assert method.server_streaming == twin.server_streaming, method.name
    assert ours.methods_by_name["ModelStreamInfer"].client_streaming
    assert ours.methods_by_name["ModelStreamInfer"].server_streaming


class _RecordingChannel:
    """Stands in for a grpc channel: records the method path and kind each stub attribute uses."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}

    def __getattr__(self, kind: str) -> Callable[..., None]:
        def register(path: str, *args: Any, **kwargs: Any) -> None:
            self.paths[path] = kind

        return register


def test_our_stub_calls_the_method_paths_tritons_stub_calls() -> None:
    ours, theirs = _RecordingChannel(), _RecordingChannel()
    inference_pb2_grpc.GRPCInferenceServiceStub(ours)
    triton_grpc.GRPCInferenceServiceStub(theirs)
    assert set(ours.paths) == {f"/{SERVICE}/{name}" for name in OUR_RPCS}
    for path, kind in ours.paths.items():
        assert theirs.paths[path] == kind, path
    assert ours.paths[f"/{SERVICE}/ModelStreamInfer"] == "stream_stream"


def _messages(container: Any) -> Iterator[Descriptor]:
    for message in container.message_types_by_name.values():
        yield message
        yield from _nested(message)


def _nested(message: Descriptor) -> Iterator[Descriptor]:
    for nested in message.nested_types:
        yield nested
        yield from _nested(nested)


def _enums(file: Any) -> Iterator[EnumDescriptor]:
    yield from file.enum_types_by_name.values()
    for message in _messages(file):
        yield from message.enum_types


def _facts(field: FieldDescriptor) -> tuple[object, ...]:
    return (
        field.name,
        field.number,
        field.type,
        field.is_repeated,
        field.message_type.full_name if field.message_type else None,
        field.enum_type.full_name if field.enum_type else None,
        field.containing_oneof.name if field.containing_oneof else None,
        field.has_presence,
    )


def _reserved(message: Descriptor) -> tuple[set[int], set[str]]:
    proto = descriptor_pb2.DescriptorProto()
    message.CopyToProto(proto)
    numbers = {n for r in proto.reserved_range for n in range(r.start, r.end)}
    return numbers, set(proto.reserved_name)


@pytest.mark.parametrize("file", [inference_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR])
def test_every_message_field_is_tritons_and_what_we_leave_out_is_reserved(file: Any) -> None:
    pool = triton_service.DESCRIPTOR.pool
    for message in _messages(file):
        twin = pool.FindMessageTypeByName(message.full_name)
        ours = {field.number: _facts(field) for field in message.fields}
        theirs = {field.number: _facts(field) for field in twin.fields}
        for number, facts in ours.items():
            assert theirs.get(number) == facts, (message.full_name, number)
        reserved_numbers, reserved_names = _reserved(message)
        for number in theirs.keys() - ours.keys():
            # Only model_config.proto leaves parts out, and then says so with `reserved`.
            assert file is model_config_pb2.DESCRIPTOR, (message.full_name, theirs[number])
            assert number in reserved_numbers, (message.full_name, theirs[number])
            assert theirs[number][0] in reserved_names, (message.full_name, theirs[number])


@pytest.mark.parametrize("file", [inference_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR])
def test_every_enum_has_tritons_values(file: Any) -> None:
    pool = triton_service.DESCRIPTOR.pool
    for enum in _enums(file):
        twin = pool.FindEnumTypeByName(enum.full_name)
        assert [(v.name, v.number) for v in enum.values] == [
            (v.name, v.number) for v in twin.values
        ]


def test_the_datatype_enum_is_complete() -> None:
    assert model_config_pb2.DataType.items() == triton_config.DataType.items()
    assert model_config_pb2.TYPE_BF16 == 14


# --- messages across the wire ------------------------------------------------------------------


# (datatype, the InferTensorContents field that carries it, two values)
CONTENTS = [
    ("BOOL", "bool_contents", [True, False]),
    ("INT32", "int_contents", [-7, 8]),
    ("INT64", "int64_contents", [-(2**40), 2**40]),
    ("UINT32", "uint_contents", [7, 2**32 - 1]),
    ("UINT64", "uint64_contents", [9, 2**64 - 1]),
    ("FP64", "fp64_contents", [1e300, -0.5]),
    ("BYTES", "bytes_contents", [b"a", b"\x00\xff"]),
]


def _add_tensors_of_every_kind(tensors: Any) -> None:
    for datatype, field, values in CONTENTS:
        tensor = tensors.add(name=f"t_{field}", datatype=datatype, shape=[2])
        tensor.parameters["note"].string_param = field
        getattr(tensor.contents, field).extend(values)


def _infer_request(side: Side) -> Message:
    service, _ = side
    m = service.ModelInferRequest(model_name="cartpole", model_version="3", id="req-7")
    m.parameters["sequence_id"].int64_param = -42
    m.parameters["priority"].uint64_param = 2**63 + 5
    m.parameters["sequence_start"].bool_param = True
    m.parameters["timeout"].double_param = 0.25
    m.parameters["tag"].string_param = "trial"
    obs = m.inputs.add(name="obs", datatype="FP32", shape=[2, 4])
    obs.parameters["binary_data_size"].int64_param = 32
    obs.contents.fp32_contents.extend([0.5, -1.25, 2.0, 3.0, 0.0, 1.0, -2.5, 4.0])
    _add_tensors_of_every_kind(m.inputs)
    m.raw_input_contents.extend([b"\x00\x00\x00?" * 8, b"\x01\x02"])
    action = m.outputs.add(name="action")
    action.parameters["classification"].int64_param = 2
    m.outputs.add(name="value")
    return m


def _infer_response(side: Side) -> Message:
    service, _ = side
    m = service.ModelInferResponse(model_name="cartpole", model_version="3", id="req-7")
    m.parameters["sequence_id"].uint64_param = 11
    action = m.outputs.add(name="action", datatype="INT64", shape=[2, 1])
    action.parameters["binary_data_size"].int64_param = 16
    action.contents.int64_contents.extend([0, 1])
    value = m.outputs.add(name="value", datatype="FP32", shape=[2])
    value.parameters["note"].bool_param = True
    value.parameters["scale"].double_param = 1.5
    value.parameters["unit"].string_param = "return"
    value.contents.fp32_contents.extend([0.5, 1.0])
    _add_tensors_of_every_kind(m.outputs)
    m.raw_output_contents.extend([b"\x00" * 16, b"\x00\x00\x80?" * 2])
    return m


def _stream_response(side: Side) -> Message:
    service, _ = side
    m = service.ModelStreamInferResponse(error_message="model 'x' is not ready")
    m.infer_response.CopyFrom(_infer_response(side))
    return m


def _metadata_response(side: Side) -> Message:
    service, _ = side
    m = service.ModelMetadataResponse(
        name="cartpole", versions=["1", "3"], platform="onnxruntime_onnx"
    )
    m.inputs.add(name="obs", datatype="FP32", shape=[-1, 4])
    m.outputs.add(name="action", datatype="INT64", shape=[-1, 1])
    m.outputs.add(name="value", datatype="FP32", shape=[-1])
    return m


def _config_response(side: Side) -> Message:
    service, config = side
    m = service.ModelConfigResponse()
    c = m.config
    c.name, c.platform, c.backend, c.runtime = "cartpole", "onnxruntime_onnx", "onnxruntime", "rt"
    c.version_policy.latest.num_versions = 2
    c.max_batch_size = 64
    obs = c.input.add(
        name="obs", data_type=config.TYPE_FP32, dims=[4], format=config.ModelInput.FORMAT_NCHW
    )
    obs.reshape.shape.extend([2, 2])
    obs.is_shape_tensor = obs.allow_ragged_batch = obs.optional = True
    obs.is_non_linear_format_io = True
    c.input.add(name="mask", data_type=config.TYPE_BOOL, dims=[-1])
    action = c.output.add(name="action", data_type=config.TYPE_INT64, dims=[1])
    action.label_filename = "labels.txt"
    action.reshape.shape.append(1)
    action.is_shape_tensor = action.is_non_linear_format_io = True
    c.output.add(name="value", data_type=config.TYPE_BF16, dims=[-1, 3])
    batching = c.dynamic_batching
    batching.preferred_batch_size.extend([16, 32])
    batching.max_queue_delay_microseconds = 500
    batching.preserve_ordering = True
    batching.priority_levels, batching.default_priority_level = 3, 2
    batching.default_queue_policy.timeout_action = config.ModelQueuePolicy.DELAY
    batching.default_queue_policy.default_timeout_microseconds = 10_000
    batching.default_queue_policy.allow_timeout_override = True
    batching.default_queue_policy.max_queue_size = 128
    batching.priority_queue_policy[1].max_queue_size = 8
    group = c.instance_group.add(
        name="cartpole_0", kind=config.ModelInstanceGroup.KIND_GPU, count=2
    )
    group.gpus.extend([0, 1])
    group.profile.append("p")
    group.passive = True
    group.host_policy = "numa0"
    c.default_model_filename = "model.onnx"
    c.parameters["observation_bounds"].string_value = "clip"
    c.model_transaction_policy.decoupled = True
    c.response_cache.enable = True
    return m


def _statistics_response(side: Side) -> Message:
    service, _ = side
    m = service.ModelStatisticsResponse()
    s = m.model_stats.add(name="cartpole", version="3", last_inference=1_700_000_000_000)
    s.inference_count, s.execution_count = 96, 3
    for i, field in enumerate(s.inference_stats.DESCRIPTOR.fields):
        duration = getattr(s.inference_stats, field.name)
        duration.count, duration.ns = i + 1, 1000 * (i + 1)
    batch = s.batch_stats.add(batch_size=32)
    for name in ["compute_input", "compute_infer", "compute_output"]:
        getattr(batch, name).count, getattr(batch, name).ns = 3, 2**40
    s.memory_usage.add(type="GPU", id=1, byte_size=2**30)
    response = s.response_stats["0"]
    for name in ["compute_infer", "compute_output", "success", "fail", "empty_response", "cancel"]:
        getattr(response, name).count, getattr(response, name).ns = 1, 7
    m.model_stats.add(name="other", version="1")
    return m


def _server_metadata(side: Side) -> Message:
    service, _ = side
    return service.ServerMetadataResponse(
        name="rlserve", version="0.1.0", extensions=["model_configuration", "statistics"]
    )


def _repository_index(side: Side) -> Message:
    service, _ = side
    m = service.RepositoryIndexResponse()
    m.models.add(name="cartpole", version="3", state="UNAVAILABLE", reason="loading failed")
    return m


def _shared_memory_status(side: Side) -> Message:
    service, _ = side
    m = service.SystemSharedMemoryStatusResponse()
    region = m.regions["io"]
    region.name, region.key, region.offset, region.byte_size = "io", "/obs", 2**40, 2**63 + 1
    return m


def _shared_memory_register(side: Side) -> Message:
    service, _ = side
    return service.SystemSharedMemoryRegisterRequest(
        name="io", key="/obs", offset=4096, byte_size=2**33
    )


def _cuda_shared_memory(side: Side) -> Message:
    service, _ = side
    return service.CudaSharedMemoryRegisterRequest(
        name="gpu", raw_handle=b"\x00\xff", device_id=-1, byte_size=64
    )


BUILDERS = [
    _shared_memory_status,
    _shared_memory_register,
    _cuda_shared_memory,
    _infer_request,
    _infer_response,
    _stream_response,
    _metadata_response,
    _config_response,
    _statistics_response,
    _server_metadata,
    _repository_index,
]


def _as_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _inner_type(field: FieldDescriptor) -> Any:
    """The message type a field holds (a map's value type for a map), or None."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return field.message_type.fields_by_name["value"].message_type
    return field.message_type


def _set_fields(message: Message, seen: set[str]) -> None:
    for field, value in message.ListFields():
        seen.add(field.full_name)
        if _inner_type(field) is None:
            continue
        if isinstance(value, Mapping):
            nested = list(value.values())
        else:
            nested = list(value) if field.is_repeated else [value]
        for inner in nested:
            _set_fields(inner, seen)


def _all_fields(message: Any, seen: set[str]) -> None:
    for field in message.fields:
        if field.full_name not in seen:
            seen.add(field.full_name)
            if _inner_type(field) is not None:
                _all_fields(_inner_type(field), seen)


@pytest.mark.parametrize(
    "build", [b for b in BUILDERS if b is not _config_response], ids=lambda b: b.__name__
)
def test_the_sample_messages_set_every_field_they_can_reach(
    build: Callable[[Side], Message],
) -> None:
    # So that the wire round trips below exercise every field, not a convenient few.
    message = build(OURS)
    reachable: set[str] = set()
    _all_fields(message.DESCRIPTOR, reachable)
    populated: set[str] = set()
    _set_fields(message, populated)
    assert reachable - populated == set()


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_our_messages_read_as_tritons_and_tritons_as_ours(build: Callable[[Side], Message]) -> None:
    ours, theirs = build(OURS), build(TRITON)
    assert ours.DESCRIPTOR.full_name == theirs.DESCRIPTOR.full_name
    assert _as_dict(ours) == _as_dict(theirs)
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )

    # ours -> wire -> Triton's class
    read_by_triton = type(theirs).FromString(ours.SerializeToString())
    assert _as_dict(read_by_triton) == _as_dict(ours)
    assert read_by_triton == theirs

    # Triton's -> wire -> our class: nothing arrives as an unknown field
    read_by_us = type(ours).FromString(theirs.SerializeToString())
    assert _as_dict(read_by_us) == _as_dict(theirs)
    assert read_by_us == ours
    assert read_by_us.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )


def test_configuration_we_do_not_describe_passes_through_as_unknown_fields() -> None:
    theirs = triton_service.ModelConfigResponse()
    theirs.config.name = "ensemble"
    theirs.config.sequence_batching.max_sequence_idle_microseconds = 5
    theirs.config.optimization.priority = triton_config.ModelOptimizationPolicy.PRIORITY_MAX
    ours = inference_pb2.ModelConfigResponse.FromString(theirs.SerializeToString())
    assert ours.config.name == "ensemble"
    assert not ours.config.HasField("dynamic_batching")
    assert triton_service.ModelConfigResponse.FromString(ours.SerializeToString()) == theirs
