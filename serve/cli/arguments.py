"""Moved to ``cli.arguments``. This re-export keeps ``import serve.cli.arguments`` working,
with a DeprecationWarning, for a release."""

import warnings

from cli.arguments import *  # noqa: F403
from cli.arguments import add_arguments, arg, from_namespace

__all__ = ["add_arguments", "arg", "from_namespace"]

warnings.warn(
    "serve.cli.arguments moved to cli.arguments: import it from there "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
