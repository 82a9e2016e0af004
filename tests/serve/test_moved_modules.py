"""Modules that moved out of ``serve`` (issue 42: the kernel, the command line, the client,
the operations tools) still import from their old paths, for a release, with a
DeprecationWarning naming the new one (nothing of ours imports them: the suite turns
warnings into errors)."""

from __future__ import annotations

import importlib
import re
import sys
import warnings

import pytest

MOVED = {  # the old path -> the new one
    "serve.errors": "kernel.errors",
    "serve.contract": "kernel.contract",
    "serve.spaces": "kernel.spaces",
    "serve.distributions": "kernel.distributions",
    "serve.cli": "cli",
    "serve.cli.arguments": "cli.arguments",
    "serve.client": "client.policy",
    "serve.lane_client": "client.lane",
    "serve.prediction": "client.prediction",
    "serve.client_connection": "client.connection",
}


@pytest.mark.parametrize(("old_name", "new_name"), MOVED.items())
def test_the_old_path_warns_and_gives_the_same_objects(old_name: str, new_name: str) -> None:
    parent = old_name.rpartition(".")[0]
    if parent != "serve":  # the moved parent package warns too, on its own: import it first
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            importlib.import_module(parent)
    sys.modules.pop(old_name, None)
    with pytest.warns(
        DeprecationWarning, match=rf"{re.escape(old_name)} moved to {re.escape(new_name)}\b"
    ):
        old = importlib.import_module(old_name)
    new = importlib.import_module(new_name)
    public = [
        n
        for n, value in vars(new).items()
        if not n.startswith("_") and getattr(value, "__module__", None) == new.__name__
    ]
    assert public
    assert all(getattr(old, n) is getattr(new, n) for n in public)
