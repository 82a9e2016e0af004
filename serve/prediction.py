"""Moved to ``client.prediction`` (the client package: ``from client import PolicyClient``). This
re-export keeps ``import serve.prediction`` working, with a DeprecationWarning, for a release."""

import warnings

from client.prediction import (  # noqa: F401
    Prediction,
    RequestFailed,
)

warnings.warn(
    "serve.prediction moved to client.prediction: import it from there, or from client "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
