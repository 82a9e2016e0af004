"""What a new policy version must show before it replaces the live one: the same
observation and action spaces, and, when the push brings a canary, the log-probs the
trainer expects for its observations (within ``atol``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from kernel.errors import InvalidInput, ModelLoadError, one_line
from serve.dataplane.messages import InferenceRequest
from serve.dataplane.model import RowModel, ServedModel, as_rows
from serve.plugins import Canary


def check_update(live: ServedModel | None, pushed: ServedModel, canary: Canary | None) -> None:
    """ModelLoadError when ``pushed`` cannot replace ``live`` (None: nothing is live)."""
    model = as_rows(pushed)
    if live is not None:
        _check_spaces(as_rows(live), model)
    if canary is not None:
        _check_canary(model, canary)


def _check_spaces(live: RowModel, model: RowModel) -> None:
    for field in ("observation_space", "action_space"):
        old, new = getattr(live.contract, field), getattr(model.contract, field)
        if old.model_dump() != new.model_dump():
            raise ModelLoadError(
                f"{field}: version {model.version} has {new.model_dump_json()}, but the live "
                f"version {live.version} has {old.model_dump_json()}; a model's spaces "
                "cannot change between versions (serve it under a new model name)"
            )


def _check_canary(model: RowModel, canary: Canary) -> None:
    inputs: dict[str, Any] = {"observations": canary.observations}
    if canary.actions is not None:
        inputs["actions"] = canary.actions
    now = time.monotonic()
    request = InferenceRequest(inputs, {"outputs": ["log_probs"]}, "canary", now, now + 60)
    prepared = model.prepare(request)
    try:
        answer = model.respond(prepared, model.execute(prepared.feeds, [prepared]), 0)
    except Exception as exc:
        raise ModelLoadError(
            f"canary: the new version fails on the canary ({one_line(exc)})"
        ) from None
    got = np.atleast_1d(np.asarray(answer["log_probs"], dtype=np.float64))
    expected = np.atleast_1d(np.asarray(canary.log_probs, dtype=np.float64))
    if got.shape != expected.shape:
        raise InvalidInput(
            f"canary.log_probs: expected {got.shape[0]} values, got {expected.shape[0]}"
        )
    worst = float(np.max(np.abs(got - expected))) if got.size else 0.0
    if not worst <= canary.atol:
        raise ModelLoadError(
            f"canary: log-probs differ from the expected ones by up to {worst:.3g} "
            f"(atol {canary.atol:g}); the new version does not behave as the trainer expects"
        )
