"""The statistics the scenarios report: percentiles, summaries of a series, least-squares
slopes and a paired bootstrap. Plain functions over lists of floats; the key names are the
ones the JSON results (and BENCHMARKS.md) carry.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(values: Sequence[float | None], scale: float = 1.0) -> dict[str, float] | None:
    """median, p90, max, min, mean of the values that are not None (None if there are none)."""
    present = [v * scale for v in values if v is not None]
    if not present:
        return None
    p90 = percentile(present, 90)
    assert p90 is not None
    return {
        "median": statistics.median(present),
        "p90": p90,
        "max": max(present),
        "min": min(present),
        "mean": statistics.fmean(present),
    }


def time_stats(values: Sequence[float]) -> dict[str, float]:
    """median, mean, min, max, stdev (0 for one value) of a series that is not empty."""
    return {
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def median_range(values: Sequence[float]) -> dict[str, float]:
    """median, min, max and how many, of a series that is not empty."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def slope_per_100(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs``, per 100 of ``xs``; None with fewer than
    three points or a single x."""
    if len(xs) < 3 or len(set(xs)) < 2:
        return None
    return statistics.linear_regression(xs, ys).slope * 100


def bootstrap_ratio(
    pairs: Sequence[tuple[float, float]], resamples: int = 5000, seed: int = 0
) -> dict[str, float]:
    """95% interval of median(first) / median(second), resampling whole pairs."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(statistics.median(r for r, _ in pick) / statistics.median(h for _, h in pick))
    ratios.sort()
    return {"low": ratios[int(0.025 * resamples)], "high": ratios[int(0.975 * resamples) - 1]}
