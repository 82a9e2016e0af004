"""What kind of model a route serves, decided once, when the model is planned.

A model's kind comes from its newest version (``serve.control.repository``) before any
version loads; its scheduler, its default deadline and the routes that answer it follow
from the kind, and a version of the other kind is refused when it loads. Nothing
rediscovers the kind from an object's type.
"""

from __future__ import annotations

from enum import StrEnum


class ModelKind(StrEnum):
    ROWS = "rows"  # one forward pass per request's rows: actor-critic policies
    GENERATIONS = "generations"  # token by token: language models

    @property
    def noun(self) -> str:
        """What one version of this kind is, in a message."""
        return _NOUNS[self]


_NOUNS = {ModelKind.ROWS: "actor-critic policy", ModelKind.GENERATIONS: "language model"}
