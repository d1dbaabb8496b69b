"""What each figure of `ledger decide` rests on: its sample, its 95 % interval, and rank IC date by date.

Each statistic is computed exactly as `decide` computes the figure, on bootstrap resamples (`bootstrap`);
the samples and the IC series: docs/decide.md."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from datetime import date

import msgspec

from usage_ledger.answers.agreement_stats import quadratic_weighted_kappa, spearman
from usage_ledger.answers.bootstrap import Evidence, bootstrap_evidence, resample_indices

__all__ = (
    "ICPoint",
    "ICSeries",
    "ic_series",
    "pair_evidence",
    "present_mean",
    "rank_ic_evidence",
    "throughput_evidence",
    "within_noise",
)

Labels = dict[str, dict[str, str]]
Draw = Callable[[int], Iterable[Sequence[int]]]
"""The resamples of n units (`bootstrap.resample_indices`; the tests give SciPy's own draws)."""
COMPARED = ("throughput_tps", "self_qwk", "self_agree_rate", "rank_ic")


class ICPoint(msgspec.Struct, frozen=True, kw_only=True):
    as_of: date
    n: int
    """Keys with a return on this date and a label from some run."""
    ic: float | None


class ICSeries(msgspec.Struct, frozen=True, kw_only=True):
    dates: list[ICPoint]
    mean: float | None
    sd: float | None
    """Sample standard deviation over the dates with an IC (k − 1 in the denominator)."""
    t: float | None
    """mean / (sd / √k); null for fewer than 2 dates or sd 0."""
    share_positive: float | None
    """Share of the dates with an IC above zero."""


def present_mean(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are there (a run pair without a kappa does not count); None if none is."""
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None


def pair_evidence(
    pairs: Sequence[tuple[str, str]], labels: Labels, scale: Sequence[str], draw: Draw = resample_indices
) -> tuple[Evidence, Evidence]:
    """The intervals of the mean QWK and of the mean agreement rate over `pairs`, resampling their keys."""
    if not pairs:
        none = Evidence(n=0, ci95=None, reason="one run: no pair of runs to compare")
        return none, none
    keys = sorted(set().union(*(labels[x].keys() & labels[y].keys() for x, y in pairs)))
    # per pair, per key: the two labels, or None when one run did not label the key
    paired = [
        [(labels[x][k], labels[y][k]) if k in labels[x] and k in labels[y] else None for k in keys] for x, y in pairs
    ]

    def drawn(pair: list[tuple[str, str] | None], rows: Sequence[int]) -> list[tuple[str, str]]:
        return [item for i in rows if (item := pair[i]) is not None]

    def kappa(rows: Sequence[int]) -> float | None:
        values = []
        for pair in paired:
            both = drawn(pair, rows)
            values.append(quadratic_weighted_kappa([p for p, _ in both], [q for _, q in both], scale).value)
        return present_mean(values)

    def rate(rows: Sequence[int]) -> float | None:
        values = []
        for pair in paired:
            both = drawn(pair, rows)
            values.append(sum(p == q for p, q in both) / len(both) if both else None)
        return present_mean(values)

    n = len(keys)
    return (
        bootstrap_evidence(kappa, n, "tickers", indices=draw(n)),
        bootstrap_evidence(rate, n, "tickers", indices=draw(n)),
    )


def _rho(
    runs: Sequence[str], labels: Labels, scale: Sequence[str], returns: dict[str, float]
) -> tuple[int, list[list[tuple[float, float] | None]]]:
    position = {label: float(i) for i, label in enumerate(scale)}
    keys = sorted(set().union(*(labels[run].keys() & returns.keys() for run in runs)))
    per_run = [[(position[labels[run][k]], returns[k]) if k in labels[run] else None for k in keys] for run in runs]
    return len(keys), per_run


def _mean_rho(per_run: list[list[tuple[float, float] | None]], rows: Sequence[int]) -> float | None:
    values = []
    for points in per_run:
        both = [item for i in rows if (item := points[i]) is not None]
        values.append(spearman([x for x, _ in both], [y for _, y in both]).value)
    return present_mean(values)


def rank_ic_evidence(
    runs: Sequence[str], labels: Labels, scale: Sequence[str], returns: dict[str, float], draw: Draw = resample_indices
) -> Evidence:
    """The interval of the mean over `runs` of Spearman's rho, resampling the keys with a return."""
    if not returns:
        return Evidence(n=0, ci95=None, reason="no returns")
    n, per_run = _rho(runs, labels, scale, returns)
    return bootstrap_evidence(lambda rows: _mean_rho(per_run, rows), n, "tickers", indices=draw(n))


def throughput_evidence(values: Sequence[float | None], draw: Draw = resample_indices) -> Evidence:
    """The interval of the mean throughput, resampling the runs that have one."""
    present = [v for v in values if v is not None]
    n = len(present)
    return bootstrap_evidence(lambda rows: math.fsum(present[i] for i in rows) / len(rows), n, "runs", indices=draw(n))


def ic_series(
    runs: Sequence[str], labels: Labels, scale: Sequence[str], dated: dict[date, dict[str, float]]
) -> ICSeries | None:
    """Rank IC per `as_of` date and its summary; None with fewer than two dates."""
    if len(dated) < 2:
        return None
    points = []
    for when in sorted(dated):
        n, per_run = _rho(runs, labels, scale, dated[when])
        points.append(ICPoint(as_of=when, n=n, ic=_mean_rho(per_run, range(n))))
    ics = [p.ic for p in points if p.ic is not None]
    k = len(ics)
    mean = math.fsum(ics) / k if k else None
    sd = statistics.stdev(ics) if k >= 2 else None
    t = mean / (sd / math.sqrt(k)) if mean is not None and sd else None
    share = sum(ic > 0 for ic in ics) / k if k else None
    return ICSeries(dates=points, mean=mean, sd=sd, t=t, share_positive=share)


def within_noise(a: dict[str, Evidence], b: dict[str, Evidence]) -> list[str]:
    """The figures whose two intervals overlap: a difference between the groups there is within noise."""
    overlapping = []
    for name in COMPARED:
        first, second = a.get(name), b.get(name)
        if first is None or second is None or first.ci95 is None or second.ci95 is None:
            continue
        if first.ci95[0] <= second.ci95[1] and second.ci95[0] <= first.ci95[1]:
            overlapping.append(name)
    return overlapping
