"""Every error code has exactly one HTTP status, and retry hints travel as Retry-After."""

from __future__ import annotations

import pytest
from grpc import StatusCode

from kernel import errors
from kernel.errors import ErrorCode, RLServeError
from serve.status import (
    GRPC_STATUS,
    HTTP_STATUS,
    grpc_status,
    grpc_trailers,
    http_headers,
    http_status,
)


def test_every_code_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(ErrorCode)
    assert all(400 <= status < 600 for status in HTTP_STATUS.values())


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.MalformedRequest("x"), 400),
        (errors.NotFound("x"), 404),
        (errors.InvalidInput("x"), 422),
        (errors.ContractError("x"), 422),
        (errors.QueueFull("x"), 429),
        (errors.ServiceUnavailable("x"), 503),
        (errors.DeadlineExceeded("x"), 504),
        (RLServeError("x"), 500),
    ],
)
def test_errors_map_to_the_statuses_clients_expect(error: RLServeError, status: int) -> None:
    assert http_status(error) == status
    assert error.to_json() == {"error": {"code": error.code.value, "message": "x"}}


def test_retry_hints_become_retry_after_and_nothing_else_adds_headers() -> None:
    assert http_headers(errors.QueueFull("full", retry_after_s=3)) == {"Retry-After": "3"}
    assert http_headers(errors.ServiceUnavailable("loading")) == {"Retry-After": "1"}
    assert http_headers(errors.InvalidInput("bad")) == {}


def test_every_error_class_of_the_hierarchy_has_its_own_code() -> None:
    classes = [c for c in vars(errors).values() if isinstance(c, type)]
    codes = [c.code for c in classes if issubclass(c, RLServeError) and c is not RLServeError]
    assert len(codes) == len(set(codes))


def test_every_code_has_a_grpc_status() -> None:
    assert set(GRPC_STATUS) == set(ErrorCode)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.MalformedRequest("x"), StatusCode.INVALID_ARGUMENT),
        (errors.InvalidInput("x"), StatusCode.INVALID_ARGUMENT),
        (errors.NotFound("x"), StatusCode.NOT_FOUND),
        (errors.QueueFull("x"), StatusCode.RESOURCE_EXHAUSTED),
        (errors.ServiceUnavailable("x"), StatusCode.UNAVAILABLE),
        (errors.DeadlineExceeded("x"), StatusCode.DEADLINE_EXCEEDED),
        (RLServeError("x"), StatusCode.INTERNAL),
    ],
)
def test_errors_map_to_the_grpc_codes_clients_expect(error: RLServeError, code: StatusCode) -> None:
    assert grpc_status(error) is code
    trailers = dict(grpc_trailers(error))
    assert trailers["rlserve-error-code"] == error.code.value
    assert ("retry-after" in trailers) == (error.retry_after_s is not None)
