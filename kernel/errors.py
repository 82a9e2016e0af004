"""The one error hierarchy of rlserve.

Every error a user can cause is an :class:`RLServeError` subclass with a stable,
protocol-neutral :class:`ErrorCode`. What a code becomes on the wire (an HTTP status, a
gRPC status) is decided in one place, ``serve.status``; an HTTP body is
``{"error": {"code": ..., "message": ...}}``, but on the Open Inference Protocol's routes
``{"error": message, "code": code}``, as that protocol's clients read it. The CLI prints
the message on one line and exits with status 2 (1 for a failed check).

Messages name the field, the bad value and what would be valid, and quote a client's input
only in part: names through :func:`quoted`, lists of names through :func:`listed`, values
through ``kernel.json_shown``; every message is capped at MESSAGE_CHARACTERS.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import ClassVar

# What of a client's input a message quotes: a name is cut after NAME_CHARACTERS, a list
# after LISTED_ITEMS (each with its count), and a whole message after MESSAGE_CHARACTERS, so
# no error answer grows with what a client sent.
NAME_CHARACTERS = 64
LISTED_ITEMS = 3
MESSAGE_CHARACTERS = 4096


class ErrorCode(StrEnum):
    """What went wrong, whatever the protocol that carries the answer."""

    MALFORMED_REQUEST = "malformed_request"  # the bytes do not parse (JSON, headers)
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    REQUEST_TIMEOUT = "request_timeout"  # the client took too long to send its request
    INVALID_INPUT = "invalid_input"  # parsed, but does not fit the policy contract
    UNSUPPORTED = "unsupported"  # a feature this server does not offer, or has turned off
    QUEUE_FULL = "queue_full"
    MODEL_LOAD_FAILED = "model_load_failed"
    CONTRACT_INVALID = "contract_invalid"
    UNAVAILABLE = "unavailable"  # not ready, loading, draining or stopped
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CONFIG_INVALID = "config_invalid"
    INTERNAL = "internal_error"
    # The tools' codes: raised by `rlserve export` (export.errors) and `rlserve rollout`
    # (ops.errors), never answered by a server; listed here so that a code names one thing.
    EXPORT_FAILED = "export_failed"
    CHECK_FAILED = "check_failed"  # a release check (rollout verify) did not pass
    KUBECTL_FAILED = "kubectl_failed"


class RLServeError(Exception):
    """Base class: an error with a code and a message meant for a person."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        message = capped(message)
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s  # when the same call may succeed if tried again

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code.value, "message": self.message}}


class MalformedRequest(RLServeError):
    code = ErrorCode.MALFORMED_REQUEST


class Unauthorized(RLServeError):
    code = ErrorCode.UNAUTHORIZED


class Forbidden(RLServeError):
    code = ErrorCode.FORBIDDEN


class NotFound(RLServeError):
    code = ErrorCode.NOT_FOUND


class MethodNotAllowed(RLServeError):
    code = ErrorCode.METHOD_NOT_ALLOWED


class Conflict(RLServeError):
    code = ErrorCode.CONFLICT


class PayloadTooLarge(RLServeError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


class RequestTimeout(RLServeError):
    code = ErrorCode.REQUEST_TIMEOUT


class InvalidInput(RLServeError):
    """The request parsed, but its content does not fit the policy contract.

    ``out_of_bounds``: the observations (rows) refused for values outside their Box's
    bounds (``observation_bounds: reject``), for rlserve_observations_out_of_bounds_total.
    """

    code = ErrorCode.INVALID_INPUT

    def __init__(self, message: str, *, out_of_bounds: int = 0) -> None:
        super().__init__(message)
        self.out_of_bounds = out_of_bounds


class Unsupported(RLServeError):
    """A feature this server does not offer, or offers only once a setting turns it on (the
    message names the setting): Triton's system shared memory without ``allow_client_shm``,
    CUDA shared memory."""

    code = ErrorCode.UNSUPPORTED


class QueueFull(RLServeError):
    code = ErrorCode.QUEUE_FULL

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class ModelLoadError(RLServeError):
    """An artifact could not be loaded: missing, corrupt, or failing its contract checks."""

    code = ErrorCode.MODEL_LOAD_FAILED


class ContractError(ModelLoadError):
    """A model file has no policy contract, or one this version cannot read."""

    code = ErrorCode.CONTRACT_INVALID


class ServiceUnavailable(RLServeError):
    code = ErrorCode.UNAVAILABLE

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class DeadlineExceeded(RLServeError):
    code = ErrorCode.DEADLINE_EXCEEDED


class ConfigError(RLServeError):
    """A setting, a config file or the model repository's layout is wrong."""

    code = ErrorCode.CONFIG_INVALID


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's text on one line, for messages that quote a library's error."""
    return " ".join(str(exc).split())[:limit]


def quoted(text: str, limit: int = NAME_CHARACTERS) -> str:
    """A name a client gave, quoted for a message: whole when short, else its start and its
    length (``'aaaa…' (20,000 characters)``)."""
    if len(text) <= limit:
        return repr(text)
    start = repr(text[:limit])
    return f"{start[:-1]}…{start[-1]} ({len(text):,} characters)"


def listed(items: Sequence[str], limit: int = LISTED_ITEMS) -> str:
    """Names a client gave, for a message, as a list: the first few quoted, and how many
    more (``['a', 'b', 'c', … and 19,997 more]``)."""
    shown = ", ".join(quoted(item) for item in items[:limit])
    if len(items) <= limit:
        return f"[{shown}]"
    return f"[{shown}, … and {len(items) - limit:,} more]"


def capped(message: str, limit: int = MESSAGE_CHARACTERS) -> str:
    """A message no longer than ``limit`` characters (its start, and its length)."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}… (the message was cut: {len(message):,} characters)"


def internal_error(exc: BaseException) -> RLServeError:
    """The one answer to a bug of ours (500, INTERNAL): its type, and where to look."""
    return RLServeError(f"internal error: {type(exc).__name__}; see the server log")
