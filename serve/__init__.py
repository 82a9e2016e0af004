"""rlserve's serving side: the model repository and the policy server.

Nothing under ``serve`` imports torch or the exporter.
"""

from kernel import __version__  # the distribution's version, declared once

__all__ = ["__version__"]
