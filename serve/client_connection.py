"""Moved to ``client.connection`` (the client package). This re-export keeps
``import serve.client_connection`` working, with a DeprecationWarning, for a release."""

import warnings

from client.connection import (  # noqa: F401
    Answer,
    Connection,
    ConnectionClosed,
    UnreadableAnswer,
)

warnings.warn(
    "serve.client_connection moved to client.connection: import it from there, or from client "
    "(this path goes in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
