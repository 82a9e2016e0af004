"""The descriptor pool our generated ``*_pb2`` modules register their .proto files in.

Our messages have the same full names as Triton's (``inference.ModelInferRequest`` and so on),
because the protocol's package is ``inference``. tritonclient's ``service_pb2`` registers those
names in protobuf's default pool, and a second file defining them there fails with "duplicate
symbol". ``generate.py`` therefore points our modules at this private pool, so that rlserve and
tritonclient (a test client, a benchmark) can live in one process. The wire format does not
involve the pool at all.

Only protobuf's upb backend (the default everywhere wheels exist) supports this fully: the
pure-Python backend (``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``) also registers message
classes in the default symbol database, so there the two still clash when both are imported.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
