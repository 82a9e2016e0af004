"""What kind of model a route serves, decided once, when the model is planned.

A model's kind comes from its newest version (``serve.plugins.kind_of_folder``) before any
version loads; its scheduler, its default deadline and the routes that answer it follow
from the kind, and a version of the other kind is refused when it loads. Nothing
rediscovers the kind from an object's type.

This enum is the registry of kinds: each member names what one version of it is (for
messages) and the module that plugs it in (``PLUGIN``, a ``serve.plugins.KindPlugin``),
imported by that name so that nothing on the shared floor imports a kind.
"""

from __future__ import annotations

from enum import Enum


class ModelKind(Enum):
    # (what one version is, the module whose PLUGIN serves the kind)
    ROWS = ("policy", "serve.policy.plugin")  # one forward pass per request's rows
    GENERATIONS = ("language model", "serve.lm.plugin")  # token by token

    def __init__(self, noun: str, plugin_module: str) -> None:
        self.noun = noun  # what one version of this kind is, in a message
        self.plugin_module = plugin_module
