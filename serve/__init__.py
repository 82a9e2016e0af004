"""rlserve's serving side: policy contracts, the model repository and the policy server.

Nothing under ``serve`` imports torch or the exporter.
"""

__version__ = "0.1.0"
