"""Moved to ``client.lane`` (the client package: ``from client import PolicyClient``). This
re-export keeps ``import serve.lane_client`` working, with a DeprecationWarning, for a release."""

import warnings

from client.lane import (  # noqa: F401
    LaneClient,
    LaneUnavailable,
)

warnings.warn(
    "serve.lane_client moved to client.lane: import it from there, or from client "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
