"""Moved to ``cli`` (the ``rlserve`` command, shared by every package: docs/architecture.md).
This re-export keeps ``serve.cli.main`` and ``python -m serve.cli`` working, with a
DeprecationWarning, for a release."""

import warnings

from cli import build_parser, main

__all__ = ["build_parser", "main"]

warnings.warn(
    "serve.cli moved to cli: import it from there (this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
