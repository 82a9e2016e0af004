"""Error codes on the wire: the one place where an :class:`~kernel.errors.ErrorCode` becomes a
protocol's status.

Every frontend (the predict data plane, the FastAPI control plane, the Open Inference
Protocol over HTTP and gRPC) answers errors through these tables, so a code means the same
thing whichever way it travels.
"""

from __future__ import annotations

from grpc import StatusCode

from kernel.errors import ErrorCode, RLServeError

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.MALFORMED_REQUEST: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.CONFLICT: 409,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.INVALID_INPUT: 422,
    ErrorCode.UNSUPPORTED: 400,
    ErrorCode.MODEL_LOAD_FAILED: 422,
    ErrorCode.CONTRACT_INVALID: 422,
    ErrorCode.EXPORT_FAILED: 422,
    ErrorCode.CHECK_FAILED: 409,
    ErrorCode.QUEUE_FULL: 429,
    ErrorCode.CONFIG_INVALID: 500,
    ErrorCode.INTERNAL: 500,
    ErrorCode.KUBECTL_FAILED: 502,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
}


def http_status(error: RLServeError) -> int:
    return HTTP_STATUS[error.code]


def http_headers(error: RLServeError) -> dict[str, str]:
    """Headers an error answer carries besides its body (Retry-After for 429 and 503)."""
    if error.retry_after_s is None:
        return {}
    return {"Retry-After": str(error.retry_after_s)}


GRPC_STATUS: dict[ErrorCode, StatusCode] = {
    ErrorCode.MALFORMED_REQUEST: StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAUTHORIZED: StatusCode.UNAUTHENTICATED,
    ErrorCode.FORBIDDEN: StatusCode.PERMISSION_DENIED,
    ErrorCode.NOT_FOUND: StatusCode.NOT_FOUND,
    ErrorCode.METHOD_NOT_ALLOWED: StatusCode.UNIMPLEMENTED,
    ErrorCode.CONFLICT: StatusCode.ALREADY_EXISTS,
    ErrorCode.REQUEST_TIMEOUT: StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.PAYLOAD_TOO_LARGE: StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.INVALID_INPUT: StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNSUPPORTED: StatusCode.INVALID_ARGUMENT,
    ErrorCode.MODEL_LOAD_FAILED: StatusCode.INVALID_ARGUMENT,
    ErrorCode.CONTRACT_INVALID: StatusCode.INVALID_ARGUMENT,
    ErrorCode.EXPORT_FAILED: StatusCode.INVALID_ARGUMENT,
    ErrorCode.CHECK_FAILED: StatusCode.FAILED_PRECONDITION,
    ErrorCode.QUEUE_FULL: StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.CONFIG_INVALID: StatusCode.INTERNAL,
    ErrorCode.INTERNAL: StatusCode.INTERNAL,
    ErrorCode.KUBECTL_FAILED: StatusCode.INTERNAL,
    ErrorCode.UNAVAILABLE: StatusCode.UNAVAILABLE,
    ErrorCode.DEADLINE_EXCEEDED: StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(error: RLServeError) -> StatusCode:
    return GRPC_STATUS[error.code]


def grpc_trailers(error: RLServeError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata an error answer carries: its code, and retry-after for 429 and 503."""
    trailers = (("rlserve-error-code", error.code.value),)
    if error.retry_after_s is None:
        return trailers
    return (*trailers, ("retry-after", str(error.retry_after_s)))
