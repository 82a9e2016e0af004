"""Moved to ``kernel.distributions`` (the policy format's kernel: docs/architecture.md). This
re-export keeps ``import serve.distributions`` working, with a DeprecationWarning, for a
release."""

import warnings

from kernel.distributions import *  # noqa: F403

warnings.warn(
    "serve.distributions moved to kernel.distributions: import it from there "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
