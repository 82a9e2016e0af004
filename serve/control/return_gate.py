"""The gate of a policy canary: promote, roll back or wait, judged by the returns episodes
earned on each version (issue 45).

What is compared: the mean episode return of the canary version against the live one,
``difference = canary mean - live mean``. The gate keeps a **confidence sequence** for the
difference: an interval that holds the true difference at every episode count at once
with probability at least ``1 - alpha``, so the gate may be asked after every episode and
stop at the first answer without inflating its error (a fixed-sample test asked
repeatedly would). Its verdicts:

- **PROMOTE** once the interval's lower end is above ``-margin``: the canary is not worse
  than the live version by more than the margin (with ``margin`` 0: it is better);
- **ROLLBACK** once the interval's upper end is below 0: the canary is worse;
- **CONTINUE** otherwise, and until each version has ``min_episodes`` episodes.

The interval is Robbins' normal mixture boundary: for a sum ``S`` of centred terms whose
variance so far is ``V``, ``|S| < sqrt((V + rho) * log((V + rho) / (rho * alpha**2)))``
at every time with probability ``1 - alpha`` (Ville's inequality on the mixture
martingale). Here ``V`` is the difference's precision ``W = 1 / (var_c / n_c + var_l /
n_l)``, so the half-width of the interval for the difference is ``sqrt((W + rho) *
log((W + rho) / (rho * alpha**2))) / W``, with the variances estimated from the episodes
so far: the *asymptotic* confidence sequence of Waudby-Smith et al. (2021,
"Time-uniform central limit theory and asymptotic confidence sequences"), valid as the
counts grow for episodes independent within each version, whatever the returns'
distribution with a finite variance. ``min_episodes`` keeps the gate from acting on the
variance of a handful of episodes. ``rho`` is tuned so that the interval is narrowest
when the two versions together have ``planned_episodes`` episodes (their shares as now).

Both versions must be judged on the same environment and the same return; episodes are
whole (the serving side never mixes versions within one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np


class Verdict(Enum):
    CONTINUE = "continue"
    PROMOTE = "promote"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class GateSettings:
    margin: float = 0.0  # how much lower a canary's mean return may be and still pass
    alpha: float = 0.05  # the chance, over the whole canary, of a wrong verdict
    min_episodes: int = 30  # per version, before any verdict
    planned_episodes: int = 1000  # both versions together: where the interval is tuned

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha: expected a probability in (0, 1), got {self.alpha}")
        if self.margin < 0:
            raise ValueError(f"margin: expected 0 or more, got {self.margin}")
        if self.min_episodes < 2:
            raise ValueError(f"min_episodes: expected 2 or more, got {self.min_episodes}")
        if self.planned_episodes < 2 * self.min_episodes:
            raise ValueError(
                f"planned_episodes: expected at least twice min_episodes "
                f"({2 * self.min_episodes}), got {self.planned_episodes}"
            )


@dataclass(frozen=True)
class Returns:
    """One version's episode returns so far: their count, mean and sum of squared
    deviations (Welford's running form: ``add`` one episode, ``merged`` two tallies)."""

    count: int = 0
    mean: float = 0.0
    squares: float = 0.0  # sum of (return - mean)^2

    def add(self, value: float) -> Returns:
        count = self.count + 1
        delta = value - self.mean
        mean = self.mean + delta / count
        return Returns(count, mean, self.squares + delta * (value - mean))

    def merged(self, other: Returns) -> Returns:
        """Both tallies as one (each gunicorn worker keeps its own)."""
        count = self.count + other.count
        if not count:
            return self
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / count
        squares = self.squares + other.squares + delta**2 * self.count * other.count / count
        return Returns(count, mean, squares)

    @property
    def variance(self) -> float:
        """The sample variance (0 with fewer than two episodes)."""
        return self.squares / (self.count - 1) if self.count > 1 else 0.0


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    difference: float  # canary mean - live mean
    lower: float  # the confidence sequence for the difference, now (-inf, inf: too early)
    upper: float
    reason: str


def decide(live: Returns, canary: Returns, settings: GateSettings) -> Decision:
    """The gate's verdict on the episodes so far."""
    difference = canary.mean - live.mean
    fewest = min(live.count, canary.count)
    if fewest < settings.min_episodes:
        return Decision(
            Verdict.CONTINUE, difference, -math.inf, math.inf,
            f"{fewest} episodes on one version; a verdict needs {settings.min_episodes} on each",
        )  # fmt: skip
    half = float(
        half_width(
            np.float64(live.count), np.float64(live.variance),
            np.float64(canary.count), np.float64(canary.variance), settings,
        )
    )  # fmt: skip
    lower, upper = difference - half, difference + half
    verdict = verdict_of(np.float64(lower), np.float64(upper), settings.margin)
    return Decision(
        Verdict(str(verdict)), difference, lower, upper, _reason(lower, upper, settings)
    )


def half_width(
    live_count: np.ndarray | np.float64,
    live_variance: np.ndarray | np.float64,
    canary_count: np.ndarray | np.float64,
    canary_variance: np.ndarray | np.float64,
    settings: GateSettings,
) -> np.ndarray:
    """The confidence sequence's half-width for the difference of means (elementwise: the
    simulations of tests/serve/control/test_return_gate.py ask it of many runs at once)."""
    spread = canary_variance / canary_count + live_variance / live_count
    floor = np.finfo(np.float64).tiny  # equal returns throughout: no spread, a point
    precision = 1.0 / np.maximum(spread, floor)
    share = canary_count / (canary_count + live_count)
    rho = _rho(settings, share, canary_variance, live_variance)
    boundary = (precision + rho) * np.log((precision + rho) / (rho * settings.alpha**2))
    return np.asarray(np.sqrt(boundary) / precision)


def verdict_of(
    lower: np.ndarray | np.float64, upper: np.ndarray | np.float64, margin: float
) -> np.ndarray:
    """PROMOTE, ROLLBACK or CONTINUE (as their values) for intervals of the difference."""
    return np.where(
        lower > -margin,
        Verdict.PROMOTE.value,
        np.where(upper < 0, Verdict.ROLLBACK.value, Verdict.CONTINUE.value),
    )


def _rho(
    settings: GateSettings,
    share: np.ndarray | np.float64,
    canary_variance: np.ndarray | np.float64,
    live_variance: np.ndarray | np.float64,
) -> np.ndarray:
    """The mixture's precision: the interval is narrowest at ``planned_episodes`` episodes
    split as now (Waudby-Smith et al.'s tuning, in the difference's precision units)."""
    planned = settings.planned_episodes
    spread = canary_variance / (planned * share) + live_variance / (planned * (1 - share))
    planned_precision = 1.0 / np.maximum(spread, np.finfo(np.float64).tiny)
    log_alpha = -2 * math.log(settings.alpha)
    return np.asarray(planned_precision / (log_alpha + math.log(1 + log_alpha)))


def _reason(lower: float, upper: float, settings: GateSettings) -> str:
    interval = f"canary - live in [{lower:.4g}, {upper:.4g}] at {1 - settings.alpha:.0%}"
    if lower > -settings.margin:
        return f"{interval}: not worse than live by more than {settings.margin:g}"
    if upper < 0:
        return f"{interval}: worse than live"
    return f"{interval}: not decided yet"
