"""Batches that want only actions run the version's graph cut to its action (on the CPU),
and get exactly the whole graph's actions; a cut that differs is not served."""

import dataclasses
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from serve import config
from serve.control import repository
from serve.dataplane.messages import InferenceRequest, Prepared
from serve.dataplane.model import as_rows
from serve.execution.graph_cut import cut_to
from serve.execution.runtime import create_session
from serve.policy.version import PolicyVersion

DEMO = Path(__file__).resolve().parents[3] / "examples/model_repository/cartpole/1/model.onnx"
RNG = np.random.default_rng(0)


def _load() -> PolicyVersion:
    settings = config.load()
    served = repository.load_file("cartpole", 1, DEMO, settings, settings.for_model({}))
    assert isinstance(served, PolicyVersion)
    return served


def _prepared(policy: PolicyVersion, parameters: dict[str, object]) -> Prepared:
    observations = RNG.uniform(-0.2, 0.2, (3, 4)).tolist()
    request = InferenceRequest({"observations": observations}, parameters, "r", 0.0, 1e9)
    return as_rows(policy).prepare(request)


def _answer(policy: PolicyVersion, batch: list[Prepared]) -> list[dict[str, np.ndarray]]:
    outputs = policy.execute(batch[0].feeds if len(batch) == 1 else _stacked(batch), batch)
    starts = np.cumsum([0] + [p.rows for p in batch])
    return [policy.respond(p, outputs, int(start)) for p, start in zip(batch, starts, strict=False)]


def _stacked(batch: list[Prepared]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([p.feeds[name] for p in batch]) for name in batch[0].feeds}


def test_an_actions_only_batch_gets_the_whole_graphs_actions_from_the_cut() -> None:
    policy = _load()
    assert policy.describe()["actions_graph"] == "cut"
    for _ in range(20):
        actions_only = [_prepared(policy, {}) for _ in range(2)]
        with_values = [_prepared(policy, {"outputs": ["actions", "values"]})]
        same_rows = dataclasses.replace(with_values[0], feeds=actions_only[0].feeds)
        cut = _answer(policy, actions_only)[0]
        whole = _answer(policy, [same_rows])[0]
        assert set(cut) == {"actions"}
        assert set(whole) == {"actions", "values"}
        assert np.array_equal(cut["actions"], whole["actions"])


def test_a_batch_that_samples_or_asks_for_more_runs_the_whole_graph() -> None:
    policy = _load()
    sampled = _prepared(policy, {"deterministic": False, "outputs": ["actions", "log_probs"]})
    answer = _answer(policy, [_prepared(policy, {}), sampled])
    assert set(answer[1]) == {"actions", "log_probs"}
    assert np.all(np.isfinite(answer[1]["log_probs"]))


def test_a_cut_that_gives_other_actions_is_not_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    whole = _load()
    cut = cut_to(DEMO, ["action"])
    assert cut is not None
    proto = onnx.load_from_string(cut)
    logits = [n for n in proto.graph.node if n.op_type == "Gemm"][-1]  # feeds the ArgMax
    for weight in proto.graph.initializer:
        if weight.name in logits.input:  # negated: every action flips
            weight.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(weight), weight.name))
    settings = config.load()
    wrong = create_session(proto.SerializeToString(), settings, "cartpole/1 (actions only)")
    policy = PolicyVersion(
        "cartpole",
        1,
        whole.contract,
        create_session(DEMO, settings, "cartpole/1"),
        whole.sha256,
        8,
        observation_bounds=settings.for_model({}).observation_bounds,
        actions=wrong,
    )
    assert policy.describe()["actions_graph"] == "whole"  # not before warm_up checked it
    with caplog.at_level(logging.WARNING, logger="rlserve.policy"):
        policy.warm_up([1, 8])
    assert policy.describe()["actions_graph"] == "whole"
    assert "every batch runs the whole graph" in caplog.text
