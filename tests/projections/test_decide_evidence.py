"""`ledger decide`'s evidence held to SciPy: each figure's sample, its percentile bootstrap interval, the IC series.

Two checks of the interval. Given SciPy's own resamples (`numpy.random.default_rng(SEED).integers(0, n,
(RESAMPLES, n))`, what `scipy.stats.bootstrap` draws), the product's interval equals SciPy's to rounding:
the method is the same. On its own draws (`random.Random(SEED)`, the product needs no numpy) it agrees
within TOLERANCE × SciPy's bootstrap standard error: each endpoint of a percentile interval from R
resamples has a resampling error of about √(0.025 · 0.975 / R) / φ(1.96) ≈ 0.06 standard errors at
R = 2,000, so two independent draws differ by about 0.085; 0.3 is three and a half times that.
The statistics in this file are numpy's, vectorized over SciPy's resamples (one call per interval, not
2,000), and held to scikit-learn's `cohen_kappa_score` and SciPy's `spearmanr` on the sample itself;
never the code under test.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats  # type: ignore[import-untyped]
from sklearn.metrics import cohen_kappa_score  # type: ignore[import-untyped]

from tests.projections.decide_trace import (
    DENSE,
    MOE,
    SCALE,
    TICKERS,
    append_trace,
    build_labels,
    build_returns,
    write_labels,
    write_returns,
)
from usage_ledger.answers.bootstrap import RESAMPLES, SEED, bootstrap_evidence, percentile
from usage_ledger.answers.decide import decide
from usage_ledger.answers.decide_evidence import pair_evidence, rank_ic_evidence, throughput_evidence
from usage_ledger.imports.label_import import import_labels, import_returns
from usage_ledger.ledger.db import Database

TOLERANCE = 0.3
Array = np.ndarray  # type: ignore[type-arg]
SCALE_TEXT = ",".join(SCALE)


def scipy_draw(n: int) -> list[list[int]]:
    return [list(map(int, row)) for row in np.random.default_rng(SEED).integers(0, n, (RESAMPLES, n))]


def positions(labels: dict[str, str]) -> Array:
    return np.array([SCALE.index(labels[key]) for key in TICKERS])


def qwk(x: Array, y: Array) -> Array:
    """Quadratic weighted kappa along the last axis: 1 − Σ(x − y)² / Σ row_i · col_j · (i − j)² / n."""
    k = np.arange(len(SCALE))
    rows = (x[..., None] == k).sum(axis=-2)
    cols = (y[..., None] == k).sum(axis=-2)
    weights = (k[:, None] - k[None, :]) ** 2
    expected = np.einsum("...i,...j,ij->...", rows, cols, weights) / x.shape[-1]
    return 1 - ((x - y) ** 2).sum(axis=-1) / expected


def rho(x: Array, y: Array) -> Array:
    """Spearman's rho along the last axis: Pearson's r of SciPy's average ranks."""
    rx, ry = stats.rankdata(x, axis=-1), stats.rankdata(y, axis=-1)
    dx, dy = rx - rx.mean(axis=-1, keepdims=True), ry - ry.mean(axis=-1, keepdims=True)
    return (dx * dy).sum(axis=-1) / np.sqrt((dx * dx).sum(axis=-1) * (dy * dy).sum(axis=-1))


def mean_qwk(*runs: Array, axis: int = -1) -> Array:
    return np.mean([qwk(x, y) for x, y in itertools.combinations(runs, 2)], axis=0)


def mean_rate(*runs: Array, axis: int = -1) -> Array:
    return np.mean([np.mean(x == y, axis=-1) for x, y in itertools.combinations(runs, 2)], axis=0)


def ic_of(returns: Array) -> Callable[..., Array]:
    def statistic(index: Array, *runs: Array, axis: int = -1) -> Array:
        return np.mean([rho(run, returns[index]) for run in runs], axis=0)

    return statistic


def scipy_ci(data: tuple[Array, ...], statistic: Callable[..., Array]) -> stats._common.BootstrapResult:  # type: ignore[name-defined]
    return stats.bootstrap(
        data,
        statistic,
        paired=True,
        vectorized=True,
        method="percentile",
        n_resamples=RESAMPLES,
        rng=np.random.default_rng(SEED),
    )


def test_the_numpy_statistics_are_scikit_learns_and_scipys() -> None:
    labels, returns = build_labels(), build_returns()
    x, y = positions(labels["moe-1"]), positions(labels["dense-2"])
    expected = cohen_kappa_score(x, y, weights="quadratic", labels=list(range(len(SCALE))))
    assert float(qwk(x, y)) == pytest.approx(expected, abs=1e-12)
    r = np.array([returns[key] for key in TICKERS])
    assert float(rho(x, r)) == pytest.approx(stats.spearmanr(x, r).statistic, abs=1e-12)


def test_given_scipys_resamples_the_intervals_are_scipys() -> None:
    labels, returns = build_labels(), build_returns()
    runs = tuple(positions(labels[run]) for run in MOE)
    qwk, rate = pair_evidence(list(itertools.combinations(MOE, 2)), labels, SCALE, draw=scipy_draw)
    expected = scipy_ci(runs, mean_qwk).confidence_interval
    assert qwk.n == len(TICKERS) and qwk.ci95 == pytest.approx([expected.low, expected.high], abs=1e-12)
    expected = scipy_ci(runs, mean_rate).confidence_interval
    assert rate.ci95 == pytest.approx([expected.low, expected.high], abs=1e-12)
    index = np.arange(len(TICKERS))
    ic = rank_ic_evidence(MOE, labels, SCALE, returns, draw=scipy_draw)
    expected = scipy_ci((index, *runs), ic_of(np.array([returns[key] for key in TICKERS]))).confidence_interval
    assert ic.n == len(TICKERS) and ic.ci95 == pytest.approx([expected.low, expected.high], abs=1e-12)
    speeds = [911.0, 874.5, 902.25, 118.0]
    tps = throughput_evidence([*speeds, None], draw=scipy_draw)
    expected = stats.bootstrap(
        (np.array(speeds),), np.mean, method="percentile", n_resamples=RESAMPLES, rng=np.random.default_rng(SEED)
    ).confidence_interval
    assert tps.n == 4 and tps.ci95 == pytest.approx([expected.low, expected.high], abs=1e-9)


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=60),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_percentile_interpolates_as_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, 100 * q)), rel=1e-9, abs=1e-6)


@given(st.lists(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False), min_size=2, max_size=30))
def test_an_interval_is_ordered_and_holds_the_resampled_means(values: list[float]) -> None:
    mean = bootstrap_evidence(lambda rows: math.fsum(values[i] for i in rows) / len(rows), len(values), "runs")
    assert mean.ci95 is not None and mean.n == len(values)
    assert min(values) - 1e-9 <= mean.ci95[0] <= mean.ci95[1] <= max(values) + 1e-9


def test_too_small_or_degenerate_samples_have_no_interval() -> None:
    one = bootstrap_evidence(lambda rows: 1.0, 1, "runs")
    assert one.ci95 is None and one.n == 1 and "at least 2" in one.reason
    alike = bootstrap_evidence(lambda rows: None if len(set(rows)) == 1 else 0.5, 3, "tickers")
    assert alike.ci95 is None and "undefined on" in alike.reason and "of 2000 resamples" in alike.reason
    single = pair_evidence([], {}, SCALE)[0]
    assert single.ci95 is None and single.reason == "one run: no pair of runs to compare"


def _close(ours: list[float] | None, theirs: stats._common.BootstrapResult) -> None:  # type: ignore[name-defined]
    assert ours is not None
    bound = TOLERANCE * theirs.standard_error
    low, high = theirs.confidence_interval
    assert abs(ours[0] - low) <= bound and abs(ours[1] - high) <= bound, (ours, low, high, bound)


def _scipy(data: tuple[Array, ...], statistic: Callable[..., Array]) -> stats._common.BootstrapResult:  # type: ignore[name-defined]
    return scipy_ci(data, statistic)


@pytest.fixture
async def dated(database: Database, tmp_path: Path) -> tuple[Database, dict[str, dict[str, float]]]:
    """The trace with returns on three dates (the latest, 2026-03-03, counts for the scalar rank IC)."""
    labels = build_labels()
    await append_trace(database, labels)
    await import_labels(database, write_labels(tmp_path / "labels.csv", labels))
    base = build_returns()
    by_date = {
        "2026-03-01": base,
        "2026-03-02": {key: -value + 0.001 * i for i, (key, value) in enumerate(base.items())},
        "2026-03-03": {key: value * 0.5 + 0.0004 * (i % 7) for i, (key, value) in enumerate(base.items())},
    }
    for when, values in by_date.items():
        await import_returns(database, write_returns(tmp_path / f"r-{when}.csv", values, as_of=when))
    return database, by_date


async def test_decide_evidence_agrees_with_scipy_on_its_own_draws(
    dated: tuple[Database, dict[str, dict[str, float]]],
) -> None:
    database, by_date = dated
    labels = build_labels()
    result = await decide(database, MOE, DENSE, SCALE_TEXT)
    moe = tuple(positions(labels[run]) for run in MOE)
    dense = tuple(positions(labels[run]) for run in DENSE)
    assert result.a.evidence["self_qwk"].n == len(TICKERS)
    _close(result.a.evidence["self_qwk"].ci95, _scipy(moe, mean_qwk))
    _close(result.b.evidence["self_agree_rate"].ci95, _scipy(dense, mean_rate))
    latest = np.array([by_date["2026-03-03"][key] for key in TICKERS])
    _close(result.b.evidence["rank_ic"].ci95, _scipy((np.arange(len(TICKERS)), *dense), ic_of(latest)))

    def between_qwk(*runs: Array, axis: int = -1) -> Array:
        first, second = runs[: len(MOE)], runs[len(MOE) :]
        return np.mean([qwk(x, y) for x, y in itertools.product(first, second)], axis=0)

    _close(result.between.evidence["qwk"].ci95, _scipy((*moe, *dense), between_qwk))
    # "within noise" is where the two groups' intervals overlap, and only there
    for name in ("self_qwk", "self_agree_rate", "rank_ic"):
        a, b = result.a.evidence[name].ci95, result.b.evidence[name].ci95
        assert a is not None and b is not None
        assert (name in result.within_noise) == (a[0] <= b[1] and b[0] <= a[1])


async def test_rank_ic_by_date_is_spearman_per_date(dated: tuple[Database, dict[str, dict[str, float]]]) -> None:
    database, by_date = dated
    labels = build_labels()
    result = await decide(database, MOE, DENSE, SCALE_TEXT)
    for group, runs in ((result.a, MOE), (result.b, DENSE)):
        series = group.rank_ic_series
        assert series is not None
        expected = [
            float(
                np.mean(
                    [
                        stats.spearmanr(positions(labels[run]), [by_date[when][key] for key in TICKERS]).statistic
                        for run in runs
                    ]
                )
            )
            for when in sorted(by_date)
        ]
        assert [p.as_of for p in series.dates] == [date.fromisoformat(when) for when in sorted(by_date)]
        assert [p.n for p in series.dates] == [len(TICKERS)] * 3
        assert [p.ic for p in series.dates] == pytest.approx(expected, abs=1e-12)
        sd = float(np.std(expected, ddof=1))
        assert series.mean == pytest.approx(float(np.mean(expected)), abs=1e-12)
        assert series.sd == pytest.approx(sd, abs=1e-12)
        assert series.t == pytest.approx(float(np.mean(expected)) / (sd / math.sqrt(3)), rel=1e-9)
        assert series.share_positive == pytest.approx(sum(ic > 0 for ic in expected) / 3)
    march_2 = await decide(database, MOE, DENSE, SCALE_TEXT, as_of=date(2026, 3, 2))
    assert march_2.a.rank_ic_series is not None and len(march_2.a.rank_ic_series.dates) == 2
    march_1 = await decide(database, MOE, DENSE, SCALE_TEXT, as_of=date(2026, 3, 1))
    assert march_1.a.rank_ic_series is None  # one date: no series, the scalar rank_ic stands alone
