"""Moved to ``client.policy`` (the client package: ``from client import PolicyClient``). This
re-export keeps ``import serve.client`` working, with a DeprecationWarning, for a release."""

import warnings

from client.lane import LaneClient, LaneUnavailable  # noqa: F401
from client.policy import (  # noqa: F401
    LANE_RETRY_S,
    AsyncPolicyClient,
    EpisodeOutcome,
    Memory,
    PolicyClient,
)
from client.prediction import Prediction, RequestFailed  # noqa: F401

warnings.warn(
    "serve.client moved to client.policy: import it from there, or from client "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
