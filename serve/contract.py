"""Moved to ``kernel.contract`` (the policy format's kernel: docs/architecture.md). This
re-export keeps ``import serve.contract`` working, with a DeprecationWarning, for a
release."""

import warnings

from kernel.contract import *  # noqa: F403

warnings.warn(
    "serve.contract moved to kernel.contract: import it from there "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
