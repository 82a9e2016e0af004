"""The one error hierarchy of rlserve.

Every error a user can cause is an :class:`RLServeError` subclass that carries its HTTP
status and a stable machine-readable ``code``. The server turns them into
``{"error": {"code": ..., "message": ...}}`` in exactly one place (``serve.process.app``); the CLI
prints the message on one line and exits with status 2.

Messages name the field, the bad value and what would be valid.
"""

from __future__ import annotations

from typing import ClassVar


class RLServeError(Exception):
    """Base class: an error with an HTTP status, a code and a message meant for a person."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class MalformedRequest(RLServeError):
    status = 400
    code = "malformed_request"


class Unauthorized(RLServeError):
    status = 401
    code = "unauthorized"


class Forbidden(RLServeError):
    status = 403
    code = "forbidden"


class NotFound(RLServeError):
    status = 404
    code = "not_found"


class Conflict(RLServeError):
    status = 409
    code = "conflict"


class PayloadTooLarge(RLServeError):
    status = 413
    code = "payload_too_large"


class InvalidInput(RLServeError):
    """The request parsed, but its content does not fit the policy contract."""

    status = 422
    code = "invalid_input"


class QueueFull(RLServeError):
    status = 429
    code = "queue_full"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class ModelLoadError(RLServeError):
    """An artifact could not be loaded: missing, corrupt, or failing its contract checks."""

    status = 422
    code = "model_load_failed"


class ContractError(ModelLoadError):
    """A model file has no policy contract, or one this version cannot read."""

    code = "contract_invalid"


class ServiceUnavailable(RLServeError):
    status = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class DeadlineExceeded(RLServeError):
    status = 504
    code = "deadline_exceeded"


class ExportError(RLServeError):
    """An export cannot proceed: a missing or corrupt checkpoint, an unsupported space."""

    status = 422
    code = "export_failed"


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's text on one line, for messages that quote a library's error."""
    return " ".join(str(exc).split())[:limit]
