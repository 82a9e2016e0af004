"""Moved to ``kernel.spaces`` (the policy format's kernel: docs/architecture.md). This
re-export keeps ``import serve.spaces`` working, with a DeprecationWarning, for a
release."""

import warnings

from kernel.spaces import *  # noqa: F403

warnings.warn(
    "serve.spaces moved to kernel.spaces: import it from there "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
