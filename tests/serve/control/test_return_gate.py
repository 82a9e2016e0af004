"""The canary gate's statistics (serve/control/return_gate.py): the running tallies, and the
confidence sequence's error rates in simulation (many canaries in one process, every one
asked after every episode, as the gate is)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from serve.control.return_gate import (
    GateSettings,
    Returns,
    Verdict,
    decide,
    half_width,
    verdict_of,
)

RUNS = 1000
EPISODES = 2000
SHARE = 0.1  # of episodes on the canary, as `rollout canary start --share 0.1` asks
ALPHA = 0.05


def test_tallies_match_numpy_and_merge_as_one() -> None:
    values = np.random.default_rng(0).normal(100, 30, 501)
    whole = Returns()
    for value in values:
        whole = whole.add(float(value))
    left, right = Returns(), Returns()
    for value in values[:200]:
        left = left.add(float(value))
    for value in values[200:]:
        right = right.add(float(value))
    merged = left.merged(right)
    for tally in (whole, merged):
        assert tally.count == len(values)
        assert tally.mean == pytest.approx(values.mean(), rel=1e-12)
        assert tally.variance == pytest.approx(values.var(ddof=1), rel=1e-9)


def test_no_verdict_before_each_version_has_its_episodes() -> None:
    settings = GateSettings(min_episodes=30)
    live, canary = Returns(), Returns()
    for value in range(100):
        live = live.add(float(value))
    for value in range(29):
        canary = canary.add(1000.0 + value)  # far better, but too few episodes
    decision = decide(live, canary, settings)
    assert decision.verdict is Verdict.CONTINUE
    assert "29 episodes" in decision.reason
    assert decide(live, canary.add(1029.0), settings).verdict is Verdict.PROMOTE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alpha", 0.0),
        ("alpha", 1.0),
        ("margin", -1.0),
        ("min_episodes", 1),
        ("planned_episodes", 10),
    ],
)
def test_settings_that_cannot_hold_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        GateSettings(**{field: value})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Outcome:
    promoted: float  # share of runs
    rolled_back: float
    undecided: float
    episodes: float  # mean episodes (both versions) to a verdict, over the runs decided


def simulate(live_mean: float, canary_mean: float, settings: GateSettings, seed: int) -> Outcome:
    """RUNS canaries of EPISODES episodes each, SHARE of them on the canary; returns are
    skewed and bounded like CartPole's (a gamma, clipped to 0..500), the gate asked after
    every episode; each run's first verdict counts."""
    rng = np.random.default_rng(seed)
    on_canary = rng.random((RUNS, EPISODES)) < SHARE
    shape = 4.0  # gamma: mean = shape * scale
    returns = np.where(
        on_canary,
        rng.gamma(shape, canary_mean / shape, (RUNS, EPISODES)),
        rng.gamma(shape, live_mean / shape, (RUNS, EPISODES)),
    ).clip(0, 500)
    arms = [_running(returns, on_canary), _running(returns, ~on_canary)]
    (n_c, mean_c, var_c), (n_l, mean_l, var_l) = arms
    ready = np.minimum(n_c, n_l) >= settings.min_episodes
    with np.errstate(divide="ignore", invalid="ignore"):
        half = half_width(n_l, var_l, n_c, var_c, settings)
        difference = mean_c - mean_l
        verdicts = verdict_of(difference - half, difference + half, settings.margin)
    decided = ready & (verdicts != Verdict.CONTINUE.value)
    first = np.where(decided.any(axis=1), decided.argmax(axis=1), -1)
    rows = np.arange(RUNS)
    final = np.where(first >= 0, verdicts[rows, np.maximum(first, 0)], Verdict.CONTINUE.value)
    took = (first + 1)[first >= 0]
    return Outcome(
        promoted=float(np.mean(final == Verdict.PROMOTE.value)),
        rolled_back=float(np.mean(final == Verdict.ROLLBACK.value)),
        undecided=float(np.mean(final == Verdict.CONTINUE.value)),
        episodes=float(took.mean()) if len(took) else math.nan,
    )


def _running(returns: np.ndarray, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each episode's running count, mean and sample variance of one version's returns."""
    count = np.cumsum(mine, axis=1).astype(np.float64)
    values = np.where(mine, returns, 0.0)
    total, squares = np.cumsum(values, axis=1), np.cumsum(values**2, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = total / count
        variance = (squares - count * mean**2) / (count - 1)
    return count, mean, np.maximum(variance, 0.0)


def _slack(rate: float) -> float:
    """Three standard errors of a rate estimated from RUNS runs."""
    return 3 * math.sqrt(rate * (1 - rate) / RUNS)


def test_the_same_policy_is_not_promoted_as_better_more_often_than_alpha() -> None:
    """With margin 0 a promotion says the canary is better: for the same policy on both
    versions any verdict is wrong, and all of them together stay under alpha."""
    outcome = simulate(200.0, 200.0, GateSettings(margin=0.0, alpha=ALPHA), seed=1)
    assert outcome.promoted <= ALPHA + _slack(ALPHA)
    assert outcome.promoted + outcome.rolled_back <= ALPHA + _slack(ALPHA)


def test_a_canary_worse_by_the_margin_is_promoted_at_most_alpha_of_the_time() -> None:
    """The edge of non-inferiority: worse by exactly the margin must not pass."""
    outcome = simulate(200.0, 190.0, GateSettings(margin=10.0, alpha=ALPHA), seed=2)
    assert outcome.promoted <= ALPHA + _slack(ALPHA)


def test_a_worse_canary_is_rolled_back_and_a_better_one_promoted() -> None:
    worse = simulate(200.0, 140.0, GateSettings(margin=5.0, alpha=ALPHA), seed=3)
    better = simulate(200.0, 260.0, GateSettings(margin=5.0, alpha=ALPHA), seed=4)
    assert worse.rolled_back >= 0.95
    assert better.promoted >= 0.95
    assert worse.promoted <= ALPHA
    # a 30% difference at a 10% share is told apart within the planned episodes
    assert worse.episodes < GateSettings().planned_episodes
    assert better.episodes < GateSettings().planned_episodes
