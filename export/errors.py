"""The exporter's error: an export that cannot proceed (the CLI prints it and exits 2)."""

from kernel.errors import ErrorCode, RLServeError


class ExportError(RLServeError):
    """An export cannot proceed: a missing or corrupt checkpoint, an unsupported space."""

    code = ErrorCode.EXPORT_FAILED
