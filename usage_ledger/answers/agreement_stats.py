"""The statistics of `ledger agreement`, in plain Python: an ordered scale, quadratic weighted kappa, Spearman.

Every function returns a `Stat`: a value, or None with the reason (never NaN). The tests hold them to
scikit-learn's `cohen_kappa_score(weights="quadratic")` and SciPy's `spearmanr`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import msgspec

from usage_ledger.projections import ProjectionError

__all__ = ("Stat", "average_ranks", "check_scale", "default_scale", "pearson", "quadratic_weighted_kappa", "spearman")


class Stat(msgspec.Struct, frozen=True, kw_only=True):
    value: float | None
    reason: str = ""
    """Why `value` is None (empty when it is not)."""


def _number(label: str) -> float | None:
    try:
        value = float(label)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def default_scale(labels: Iterable[str]) -> list[str]:
    """The labels in order: numerically when every one is a finite number, else as strings."""
    distinct = set(labels)
    numbers = {label: _number(label) for label in distinct}
    if distinct and all(v is not None for v in numbers.values()):
        return sorted(distinct, key=lambda label: (numbers[label], label))
    return sorted(distinct)


def check_scale(scale: Sequence[str], labels: Iterable[str]) -> None:
    """ProjectionError when `scale` repeats a label or misses labels that occur (naming them)."""
    repeated = sorted({label for label in scale if scale.count(label) > 1})
    if repeated:
        raise ProjectionError(f"--scale names {', '.join(map(repr, repeated))} more than once")
    outside = sorted(set(labels) - set(scale))
    if outside:
        raise ProjectionError(
            f"labels outside --scale: {', '.join(map(repr, outside))} (add them to --scale, or fix the extraction)"
        )


def quadratic_weighted_kappa(a: Sequence[str], b: Sequence[str], scale: Sequence[str]) -> Stat:
    """Cohen's kappa of paired labels `a[i]`, `b[i]` with weights (i − j)² over the positions on `scale`.

    κ = 1 − Σ w·O / Σ w·E, O the observed pair counts, E the counts expected from the two marginal
    distributions (row total × column total / n). The weights' scale cancels, so (i − j)² and
    (i − j)²/(K − 1)² give the same κ.
    """
    if len(a) != len(b):
        raise ValueError("paired labels of different lengths")
    n = len(a)
    if n == 0:
        return Stat(value=None, reason="no keys in common")
    index = {label: i for i, label in enumerate(scale)}
    k = len(scale)
    rows, cols = [0] * k, [0] * k
    observed = 0.0
    for x, y in zip(a, b, strict=True):
        i, j = index[x], index[y]
        rows[i] += 1
        cols[j] += 1
        observed += (i - j) ** 2
    expected = sum(rows[i] * cols[j] * (i - j) ** 2 for i in range(k) if rows[i] for j in range(k) if cols[j]) / n
    if expected == 0:
        only = next(scale[i] for i in range(k) if rows[i])
        return Stat(value=None, reason=f"both runs gave every key the one label {only!r}: kappa is undefined")
    return Stat(value=1.0 - observed / expected)


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties sharing the mean of the ranks they span (what Spearman's rho ranks by)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0  # ranks before this group of equal values
    for _, group in itertools.groupby(order, key=values.__getitem__):
        members = list(group)
        shared = start + (len(members) + 1) / 2  # the mean of ranks start + 1 … start + len(members)
        for index in members:
            ranks[index] = shared
        start += len(members)
    return ranks


def pearson(x: Sequence[float], y: Sequence[float]) -> Stat:
    """Pearson's correlation; None when there are fewer than two pairs or a side is constant."""
    n = len(x)
    if n < 2:
        return Stat(value=None, reason=f"{n} key(s) with both a label and an outcome: need at least 2")
    mx, my = math.fsum(x) / n, math.fsum(y) / n
    dx = [v - mx for v in x]
    dy = [v - my for v in y]
    sxx, syy = math.fsum(d * d for d in dx), math.fsum(d * d for d in dy)
    if sxx == 0 or syy == 0:
        side = "label" if sxx == 0 else "outcome"
        return Stat(value=None, reason=f"every key has the same {side} rank: the correlation is undefined")
    r = math.fsum(p * q for p, q in zip(dx, dy, strict=True)) / math.sqrt(sxx * syy)
    return Stat(value=max(-1.0, min(1.0, r)))


def spearman(x: Sequence[float], y: Sequence[float]) -> Stat:
    """Spearman's rho: Pearson's correlation of the average ranks (ties handled as SciPy does)."""
    return pearson(average_ranks(x), average_ranks(y))
