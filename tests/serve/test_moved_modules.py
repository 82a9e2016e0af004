"""The policy format's modules moved to ``kernel`` (issue 42); their old paths still import,
for a release, with a DeprecationWarning naming the new one (nothing of ours imports them:
the suite turns warnings into errors)."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize("name", ["errors", "contract", "spaces", "distributions"])
def test_the_old_path_warns_and_gives_the_same_objects(name: str) -> None:
    sys.modules.pop(f"serve.{name}", None)
    with pytest.warns(DeprecationWarning, match=rf"serve\.{name} moved to kernel\.{name}"):
        old = importlib.import_module(f"serve.{name}")
    new = importlib.import_module(f"kernel.{name}")
    public = [
        n
        for n, value in vars(new).items()
        if not n.startswith("_") and getattr(value, "__module__", None) == new.__name__
    ]
    assert public
    assert all(getattr(old, n) is getattr(new, n) for n in public)
