"""Intervals and tests shared by the evaluation cells and the report (numpy only, no torch).

Why not scipy.stats: scipy is not a dependency, and a seeded percentile bootstrap of a mean, a
Wilson interval and an exact sign test are a few lines each; keeping them in a torch-free module
lets the report stage use them without importing the generation engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (seeded: same inputs, same interval).

    Empty input gives (nan, nan); a single value or `resamples == 0` gives (mean, mean).
    """
    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        return math.nan, math.nan
    if data.size == 1 or resamples <= 0:
        mean = float(data.mean())
        return mean, mean
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)


def paired_gap(
    ours: Mapping[str, float], theirs: Mapping[str, float], *, resamples: int = 1000, seed: int = 0
) -> tuple[float, float, float, int]:
    """Mean per-problem difference `ours - theirs` over the problems both were scored on, with a
    paired percentile bootstrap 95% interval (problems resampled, each keeping both outcomes).

    Returns (gap, low, high, n); n = 0 gives nan for all three numbers."""
    shared = sorted(set(ours) & set(theirs))
    differences = [ours[key] - theirs[key] for key in shared]
    if not differences:
        return math.nan, math.nan, math.nan, 0
    low, high = bootstrap_ci(differences, resamples=resamples, seed=seed)
    return float(np.mean(differences)), low, high, len(differences)


def wilson_interval(successes: float, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (`successes` of `n`); n <= 0 gives (nan, nan).

    Why beside the bootstrap: a percentile bootstrap of 0/n or n/n outcomes can only return [0, 0] or
    [1, 1], which claims certainty that 48 problems do not give (0/48 is Wilson [0, 7.4%]). A
    fractional `successes` (avg@k: attempts averaged per problem) gives the same formula's value."""
    if n <= 0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    p = min(max(successes / n, 0.0), 1.0)
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def sign_test(ours: Mapping[str, float], theirs: Mapping[str, float]) -> tuple[int, int, float]:
    """Exact two-sided sign test of paired per-problem outcomes (for 0/1 outcomes: the exact McNemar
    test): (wins, losses, p) over the problems both were scored on, ties left out; no problem where
    they differ gives p = 1.

    Why beside `paired_gap`: with a handful of problems where the two differ, the paired percentile
    bootstrap interval is narrower than the evidence (4 wins and 0 losses give an interval above 0,
    and an exact p of 0.125)."""
    shared = set(ours) & set(theirs)
    wins = sum(1 for key in shared if ours[key] > theirs[key])
    losses = sum(1 for key in shared if ours[key] < theirs[key])
    return wins, losses, sign_test_p(wins, losses)


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided p of `wins` against `losses` discordant pairs under H0: each is a fair coin
    (p = 1 without a discordant pair). Counts may be pooled over independent runs
    (`selfcest.spread`): the pooled discordant pairs are still fair coins under H0."""
    if wins < 0 or losses < 0:
        raise ValueError(f"sign test counts must be >= 0, got {wins} wins and {losses} losses")
    discordant = wins + losses
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, i) for i in range(min(wins, losses) + 1)) / 2**discordant
    return min(1.0, 2.0 * tail)
