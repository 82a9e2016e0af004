"""Fixtures shared by test folders. Nothing here imports torch when the module is imported."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from examples.lm.tiny_policy import TinyPolicies

FIXTURES_ENV = "RLSERVE_LM_FIXTURES"


@pytest.fixture(scope="session")
def tiny_policies(tmp_path_factory: pytest.TempPathFactory) -> TinyPolicies:
    """Tiny Llama and Qwen2 policies from genuine TRL runs (examples/lm/tiny_policy.py).

    Built once per test session, in about half a minute, under the session's temporary
    directory. To reuse them between local runs, set ``RLSERVE_LM_FIXTURES=DIR``: they are
    built in DIR only if DIR holds no complete build of the current recipe and library
    versions (its tiny_policies.json says which), and reused otherwise. Tests must not write
    into these directories.
    """
    from examples.lm.tiny_policy import existing_policies, make_policies

    shared = os.environ.get(FIXTURES_ENV)
    root = Path(shared) if shared else tmp_path_factory.mktemp("tiny_policies")
    return existing_policies(root) or make_policies(root)
