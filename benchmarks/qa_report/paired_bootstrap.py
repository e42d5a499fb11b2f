"""Paired comparison of two systems on the same questions: per-question differences and a bootstrap interval of
their mean (Efron and Tibshirani's percentile interval).

S = seeds, Q = questions, R = bootstrap resamples.
"""

from __future__ import annotations

import numpy as np


def paired_differences(scores: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """Q: per question, the mean over seeds of (score - baseline score of the same seed). scores, baseline: S x Q,
    row s of both from seed s."""
    if scores.shape != baseline.shape or scores.ndim != 2:
        raise ValueError(f"paired scores need equal S x Q shapes, got {scores.shape} and {baseline.shape}")
    return (scores - baseline).mean(axis=0)  # Q


def bootstrap_interval(
    values: np.ndarray, resamples: int = 10_000, seed: int = 1, level: float = 0.95, chunk: int = 500
) -> tuple[float, float]:
    """The ``level`` percentile-bootstrap interval of the mean of ``values`` (Q): ``resamples`` draws of Q values
    with replacement from ``numpy.random.default_rng(seed)``, the mean of each draw, and the (1 - level) / 2 and
    (1 + level) / 2 quantiles of those R means (numpy's linear interpolation). Drawn ``chunk`` resamples at a time
    (a chunk x Q index array)."""
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"bootstrap_interval needs a non-empty vector, got shape {values.shape}")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level must lie in (0, 1) and resamples be positive, got {level} and {resamples}")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)  # R
    for first in range(0, resamples, chunk):
        count = min(chunk, resamples - first)
        drawn = rng.integers(0, values.size, size=(count, values.size))  # count x Q question indices
        means[first : first + count] = values[drawn].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
