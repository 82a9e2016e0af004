"""Policy heads over a whole batch: sampled actions, log-probabilities, given actions.

The reference is ``kernel.distributions`` applied to one request's rows alone, as the
server computed answers before heads were vectorised: a batch must not change them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kernel.distributions import Categorical, DiagGaussian, MultiCategorical
from serve.dataplane.messages import Prepared
from serve.policy.heads import PolicyHeads
from serve.policy.validation import DEFAULT_OPTIONS, predict_options
from serve.types import Outputs
from tests.serve.policy.contracts import contract

OBS = {"type": "Box", "shape": [3], "dtype": "float32"}
BOX = {"type": "Box", "shape": [2], "dtype": "float32", "low": -1.0, "high": 1.0}
DISCRETE = {"type": "Discrete", "n": 4}
MULTI = {"type": "MultiDiscrete", "nvec": [3, 2]}


def request(rows: int, evaluate: np.ndarray | None = None, **parameters: Any) -> Prepared:
    feeds = {"obs": np.zeros((rows, 3), np.float32)}
    options = predict_options(parameters) if parameters else DEFAULT_OPTIONS
    return Prepared(feeds, rows, False, options, evaluate, "r", 0.0, 1.0)


def graph(action_space: dict[str, Any], rows: int, seed: int = 0) -> Outputs:
    """What an exported graph would output for ``rows`` rows."""
    rng = np.random.default_rng(seed)
    value = rng.standard_normal(rows).astype(np.float32)
    if action_space["type"] == "Box":
        mean = rng.standard_normal((rows, 2)).astype(np.float32)
        log_std = np.full((rows, 2), -0.5, np.float32)
        return {"action": np.clip(mean, -1, 1), "mean": mean, "log_std": log_std, "value": value}
    width = sum(action_space["nvec"]) if "nvec" in action_space else action_space["n"]
    logits = rng.standard_normal((rows, width)).astype(np.float32)
    if "nvec" in action_space:
        action = MultiCategorical(logits, tuple(action_space["nvec"])).mode()
    else:
        action = Categorical(logits).mode()
    return {"action": action, "logits": logits, "value": value}


def run(action_space: dict[str, Any], requests: list[Prepared], seed: int = 0) -> Outputs:
    rows = sum(r.rows for r in requests)
    return PolicyHeads(contract(OBS, action_space))(graph(action_space, rows, seed), requests)


def test_deterministic_batches_are_the_graphs_actions_with_nothing_sampled() -> None:
    outputs = run(DISCRETE, [request(2), request(3)])
    np.testing.assert_array_equal(outputs["actions"], graph(DISCRETE, 5)["action"])
    assert "log_probs" not in outputs
    assert set(outputs) == {"actions", "logits", "values"}


@pytest.mark.parametrize("space", [DISCRETE, BOX, MULTI])
def test_a_seeded_request_gets_the_same_actions_whoever_shares_its_batch(
    space: dict[str, Any],
) -> None:
    seeded = request(2, deterministic=False, seed=11, outputs=["actions", "log_probs"])
    crowd = [request(3, deterministic=False), request(1), seeded, request(2, deterministic=False)]
    heads = PolicyHeads(contract(OBS, space))  # the seeded rows sit at 4:6 among others
    mine = graph(space, 2, seed=5)
    others = graph(space, 6, seed=6)
    together = {k: np.concatenate([others[k][:4], mine[k], others[k][4:]]) for k in mine}
    shared = heads(together, crowd)
    alone = heads(mine, [seeded])
    np.testing.assert_array_equal(shared["actions"][4:6], alone["actions"])
    np.testing.assert_allclose(shared["log_probs"][4:6], alone["log_probs"], rtol=0, atol=0)


def test_a_seed_reproduces_what_the_reference_distribution_samples() -> None:
    heads = PolicyHeads(contract(OBS, BOX))
    outputs = graph(BOX, 3, seed=2)
    answer = heads(outputs, [request(3, deterministic=False, seed=7, outputs=["log_probs"])])
    reference = DiagGaussian(outputs["mean"], outputs["log_std"])
    sampled = reference.sample(np.random.default_rng(7))
    np.testing.assert_allclose(answer["actions"], np.clip(sampled, -1, 1), atol=1e-6)
    np.testing.assert_allclose(answer["log_probs"], reference.log_prob(sampled), atol=1e-6)


def test_log_probs_score_the_action_each_row_took() -> None:
    heads = PolicyHeads(contract(OBS, DISCRETE))
    outputs = graph(DISCRETE, 5, seed=3)
    given = np.array([3, 0], dtype=np.int64)
    requests = [
        request(2, outputs=["log_probs"]),  # deterministic: the mode
        request(2, evaluate=given, outputs=["log_probs"]),  # scored: the given actions
        request(1, deterministic=False, seed=4, outputs=["log_probs"]),  # sampled
    ]
    answer = heads(outputs, requests)
    reference = Categorical(outputs["logits"])
    taken = np.concatenate([reference.mode()[:2], given, answer["actions"][4:]])
    expected = reference.log_prob(taken)
    np.testing.assert_allclose(answer["log_probs"], expected, atol=1e-7)
    sampled = Categorical(outputs["logits"][4:]).sample(np.random.default_rng(4))
    np.testing.assert_array_equal(answer["actions"][4:], sampled)


def test_unseeded_requests_are_sampled_and_differ_between_batches() -> None:
    heads = PolicyHeads(contract(OBS, BOX))
    outputs = graph(BOX, 64, seed=1)
    first = heads(outputs, [request(64, deterministic=False)])["actions"]
    second = heads(outputs, [request(64, deterministic=False)])["actions"]
    assert not np.array_equal(first, second)
    assert np.all(np.abs(first) <= 1.0)  # clipped to the Box
    assert first.shape == (64, 2)
