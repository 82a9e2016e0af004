"""The Open Inference Protocol's gRPC definitions: ``inference.proto`` (the
``inference.GRPCInferenceService`` service and its messages) and ``model_config.proto`` (the part of
Triton's model configuration rlserve describes). The ``*_pb2.py`` / ``*_pb2_grpc.py`` modules and
their ``.pyi`` stubs next to them are generated, not written: by grpcio-tools' protoc and
mypy-protobuf, through ``generate.py``, which also points them at the private descriptor pool in
``_pool.py``. Do not edit them; edit the .proto files and regenerate with ``make proto``
(``python -m serve.frontends.oip.proto.generate``)."""
