"""Bootstrap intervals shared by the evaluation cells and the report (numpy only, no torch).

Why not scipy.stats.bootstrap: scipy is not a dependency, and a seeded percentile bootstrap of a
mean is a few lines of numpy; keeping it in a torch-free module lets the report stage use it
without importing the generation engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
