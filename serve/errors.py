"""Moved to ``kernel.errors`` (the policy format's kernel: docs/architecture.md). This
re-export keeps ``import serve.errors`` working, with a DeprecationWarning, for a
release."""

import warnings

from kernel.errors import *  # noqa: F403

warnings.warn(
    "serve.errors moved to kernel.errors: import it from there "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
