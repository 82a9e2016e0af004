"""The operations tools' errors: a release check that did not pass, a cluster command that
failed (the CLI prints them; a failed check exits 1, anything else 2)."""

from kernel.errors import ErrorCode, RLServeError


class CheckFailed(RLServeError):
    """A color is not fit to take traffic: nothing was switched (the CLI exits 1)."""

    code = ErrorCode.CHECK_FAILED


class KubectlError(RLServeError):
    code = ErrorCode.KUBECTL_FAILED
