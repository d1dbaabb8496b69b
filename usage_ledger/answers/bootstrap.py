"""What a figure rests on: its sample size and a 95 % percentile bootstrap interval, in plain Python.

SciPy's `bootstrap(..., method="percentile")` with indices from `random.Random(SEED)`, so an interval is the
same every time (tests/projections/test_bootstrap.py; docs/decide.md). No interval when the statistic is
undefined on some resample: one over the resamples that have a value would be narrower than the evidence."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence

import msgspec

__all__ = ("CONFIDENCE", "RESAMPLES", "SEED", "Evidence", "bootstrap_evidence", "percentile", "resample_indices")

RESAMPLES = 2000
"""Resamples per interval: each endpoint's resampling error is then about 6 % of the figure's bootstrap
standard error (docs/decide.md), small against the interval; SciPy's default of 9,999 costs 5 × the time."""
SEED = 53
CONFIDENCE = 0.95

Statistic = Callable[[Sequence[int]], float | None]
"""The figure computed on the units at these indices (with repeats); None when it is undefined there."""


class Evidence(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    n: int
    """The sample: tickers for the label figures, runs for throughput."""
    ci95: list[float] | None
    """[low, high], the 95 % percentile bootstrap interval; null when it cannot be given (`reason`)."""
    reason: str = ""


def resample_indices(n: int) -> Iterator[list[int]]:
    """`RESAMPLES` rows of `n` indices in 0..n-1, drawn with replacement from `random.Random(SEED)`."""
    rng = random.Random(SEED)
    units = range(n)
    for _ in range(RESAMPLES):
        yield rng.choices(units, k=n)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0-1) of `values`, linearly interpolated between order statistics (numpy's default)."""
    ordered = sorted(values)
    h = (len(ordered) - 1) * q
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (h - low) * (ordered[high] - ordered[low])


def bootstrap_evidence(
    statistic: Statistic, n: int, unit: str, *, indices: Iterable[Sequence[int]] | None = None
) -> Evidence:
    """The sample size and the percentile interval of `statistic` over resamples of its `n` units (`unit`
    names them in a reason). `indices`: the resamples to use (by default `resample_indices(n)`)."""
    if n < 2:
        return Evidence(n=n, ci95=None, reason=f"n = {n} {unit}: an interval needs at least 2")
    values: list[float] = []
    undefined = 0
    for row in indices if indices is not None else resample_indices(n):
        value = statistic(row)
        if value is None:
            undefined += 1
        else:
            values.append(value)
    if undefined:
        return Evidence(
            n=n,
            ci95=None,
            reason=f"undefined on {undefined} of {undefined + len(values)} resamples of the {n} {unit} "
            "(too few, or too alike): no interval",
        )
    alpha = (1 - CONFIDENCE) / 2
    return Evidence(n=n, ci95=[percentile(values, alpha), percentile(values, 1 - alpha)])
