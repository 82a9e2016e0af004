"""rlserve's Python client: what a trainer, an actor or a script needs to call a server.

    from client import PolicyClient

``PolicyClient`` (and ``AsyncPolicyClient``) speak HTTP to any rlserve server and, given
``lane=PATH``, the local shared-memory lane to one on the same host (``LaneClient`` is the
lane alone). Answers are :class:`Prediction`; a refused call raises :class:`RequestFailed`
with the server's status, code and message.

The package imports the kernel (the policy format and the lane's wire format) and never the
server, so a training job installs it without the serving side.
"""

from client.lane import LaneClient, LaneUnavailable
from client.policy import AsyncPolicyClient, EpisodeOutcome, PolicyClient
from client.prediction import Prediction, RequestFailed

__all__ = [
    "AsyncPolicyClient",
    "EpisodeOutcome",
    "LaneClient",
    "LaneUnavailable",
    "PolicyClient",
    "Prediction",
    "RequestFailed",
]
