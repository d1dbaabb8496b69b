"""`ledger decide`: the adoption decision's evidence for two groups of runs, side by side, and what is not
measured (the figures: docs/decide.md). No verdict. The statistics are `agreement_stats`' (one definition)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import date

import msgspec

from usage_ledger.answers.agreement import parse_scale
from usage_ledger.answers.agreement_stats import check_scale, quadratic_weighted_kappa, spearman
from usage_ledger.answers.bootstrap import Evidence
from usage_ledger.answers.compare import run_column
from usage_ledger.answers.comparison import RunComparison, metric_values
from usage_ledger.answers.decide_evidence import (
    ICSeries,
    ic_series,
    pair_evidence,
    present_mean,
    rank_ic_evidence,
    throughput_evidence,
    within_noise,
)
from usage_ledger.answers.eras import left_out_reason
from usage_ledger.ledger import Database
from usage_ledger.projections import (
    CostMeans,
    ProjectionError,
    Returns,
    cost_means,
    recorded_labels,
    recorded_return_values,
    recorded_returns,
)

__all__ = ("LATENCY_FIGURES", "SERVER_FIGURES", "Between", "Decision", "FlippedKey", "GroupFigures", "decide")

LATENCY_FIGURES = ("ttft_ms.p50", "tpot_ms.p50", "itl_ms.p50", "e2e_ms.p50")
SERVER_FIGURES = ("spec_decode_acceptance_rate", "kv_cache_usage_max", "preemptions")


class GroupFigures(msgspec.Struct, frozen=True, kw_only=True):
    runs: list[str]
    throughput_tps: float | None
    hours_per_100_tickers: float | None
    measured_runs: int = 0
    """The runs the throughput and hours figures rest on (means over these)."""
    left_out: dict[str, str] = {}
    """The runs left out of them, each with why (`eras.left_out_reason`)."""
    cost: CostMeans | None = None
    """Means of the measured runs priced (`ledger annotate --price-per-hour`); None: none is, or mixed currencies."""
    latency: dict[str, float | None]
    """`ledger compare`'s medians (`ttft_ms.p50`, `tpot_ms.p50`, `itl_ms.p50`, `e2e_ms.p50`), mean over the runs."""
    server: dict[str, float]
    """Acceptance, KV cache use, preemptions (ServerBlock's names), mean over the runs sampled; absent: none was."""
    self_qwk: float | None
    self_agree_rate: float | None
    label_shares: dict[str, float]
    rank_ic: float | None
    evidence: dict[str, Evidence] = {}
    """`throughput_tps`, `self_qwk`, `self_agree_rate`, `rank_ic` → their sample and 95 % interval."""
    rank_ic_series: ICSeries | None = None
    """Rank IC per `as_of` date of the returns, when they come on two dates or more."""


class FlippedKey(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    a: list[str]
    """Group a's most frequent label (several on a tie), in scale order."""
    b: list[str]


class Between(msgspec.Struct, frozen=True, kw_only=True):
    qwk: float | None
    agree_rate: float | None
    flipped: list[FlippedKey]
    evidence: dict[str, Evidence] = {}
    """`qwk`, `agree_rate` → their sample (tickers) and 95 % interval."""


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    a: GroupFigures
    b: GroupFigures
    between: Between
    unmeasured: list[str]
    within_noise: list[str] = []
    """The figures whose a and b intervals overlap: a difference there is within noise."""


def _pairs(
    pairs: Iterable[tuple[str, str]], labels: dict[str, dict[str, str]], scale: Sequence[str], notes: list[str]
) -> tuple[float | None, float | None]:
    """Mean QWK and mean agreement rate over the pairs (each over the keys both runs labelled)."""
    kappas: list[float | None] = []
    rates: list[float | None] = []
    for x, y in pairs:
        common = sorted(labels[x].keys() & labels[y].keys())
        first, second = [labels[x][k] for k in common], [labels[y][k] for k in common]
        kappa = quadratic_weighted_kappa(first, second, scale)
        if kappa.value is None:
            notes.append(f"QWK {x} vs {y}: {kappa.reason}")
        kappas.append(kappa.value)
        rates.append(sum(p == q for p, q in zip(first, second, strict=True)) / len(common) if common else None)
    return present_mean(kappas), present_mean(rates)


def _shares(runs: Sequence[str], labels: dict[str, dict[str, str]], scale: Sequence[str]) -> dict[str, float]:
    counts = Counter(label for run in runs for label in labels[run].values())
    total = sum(counts.values())
    return {label: counts[label] / total for label in scale} if total else {}


def _rank_ic(
    runs: Sequence[str], labels: dict[str, dict[str, str]], scale: Sequence[str], returns: Returns, notes: list[str]
) -> float | None:
    if not returns.values:
        return None
    position = {label: float(i) for i, label in enumerate(scale)}
    values: list[float | None] = []
    for run in runs:
        keys = sorted(labels[run].keys() & returns.values.keys())
        rho = spearman([position[labels[run][k]] for k in keys], [returns.values[k] for k in keys])
        if rho.value is None:
            notes.append(f"rank IC {run}: {rho.reason}")
        values.append(rho.value)
    return present_mean(values)


def _group(
    runs: Sequence[str],
    columns: dict[str, RunComparison],
    labels: dict[str, dict[str, str]],
    scale: Sequence[str],
    returns: Returns,
    dated: dict[date, dict[str, float]],
    notes: list[str],
) -> GroupFigures:
    figures = [metric_values(columns[run]) for run in runs]
    server: dict[str, float] = {}
    for name in SERVER_FIGURES:
        value = present_mean(f[f"server.{name}"] for f in figures)
        if value is not None:
            server[name] = value
    pairs = list(itertools.combinations(runs, 2))
    self_qwk, self_rate = _pairs(pairs, labels, scale, notes)
    left_out = {
        run: why
        for run in runs
        if (why := left_out_reason(columns[run].ok_calls, _throughput(columns[run]), columns[run].formula))
    }
    measured = [columns[run] for run in runs if run not in left_out]
    throughputs = [_throughput(column) for column in measured]
    qwk_evidence, rate_evidence = pair_evidence(pairs, labels, scale)
    evidence = {
        "throughput_tps": throughput_evidence(throughputs),
        "self_qwk": qwk_evidence,
        "self_agree_rate": rate_evidence,
        "rank_ic": rank_ic_evidence(runs, labels, scale, returns.values),
    }
    return GroupFigures(
        runs=list(runs),
        throughput_tps=present_mean(throughputs),
        hours_per_100_tickers=present_mean(column.hours_per_100_tickers for column in measured),
        measured_runs=len(measured),
        left_out=left_out,
        cost=cost_means(column.cost for column in measured),
        latency={name: present_mean(f[name] for f in figures) for name in LATENCY_FIGURES},
        server=server,
        self_qwk=self_qwk,
        self_agree_rate=self_rate,
        label_shares=_shares(runs, labels, scale),
        rank_ic=_rank_ic(runs, labels, scale, returns, notes),
        evidence=evidence,
        rank_ic_series=ic_series(runs, labels, scale, dated),
    )


def _throughput(column: RunComparison) -> float | None:
    return column.throughput_tps.get(column.formula)


def _most_frequent(runs: Sequence[str], labels: dict[str, dict[str, str]], key: str, scale: Sequence[str]) -> list[str]:
    counts = Counter(labels[run][key] for run in runs if key in labels[run])
    top = max(counts.values())
    return [label for label in scale if counts[label] == top]


def _flipped(
    a: Sequence[str], b: Sequence[str], labels: dict[str, dict[str, str]], scale: Sequence[str]
) -> list[FlippedKey]:
    in_a = {key for run in a for key in labels[run]}
    in_b = {key for run in b for key in labels[run]}
    flipped = []
    for key in sorted(in_a & in_b):
        first, second = _most_frequent(a, labels, key, scale), _most_frequent(b, labels, key, scale)
        if first != second:
            flipped.append(FlippedKey(key=key, a=first, b=second))
    return flipped


def _unmeasured(
    groups: dict[str, Sequence[str]],
    columns: dict[str, RunComparison],
    labels: dict[str, dict[str, str]],
    returns: Returns,
    as_of: date | None,
) -> list[str]:
    missing: list[str] = []
    if not returns.keys_recorded:
        missing.append("no returns recorded: rank IC is not measured (ledger returns import FILE.csv)")
    elif not returns.values:
        missing.append(f"no return dated on or before {as_of}: rank IC is not measured")
    for name, runs in groups.items():
        if len(runs) == 1:
            missing.append(f"group {name} has one run only: self-agreement needs a second repetition")
        for run in runs:
            if not labels[run]:
                missing.append(f"run {run} has no labels (ledger labels import)")
            elif returns.values and not labels[run].keys() & returns.values.keys():
                missing.append(f"run {run}: none of its labelled keys has a return")
        if all(columns[run].server is None for run in runs):
            missing.append(f"group {name}: no server samples (acceptance, KV cache, preemptions not measured)")
    return missing


async def decide(
    database: Database,
    a: Sequence[str],
    b: Sequence[str],
    scale: str,
    *,
    as_of: date | None = None,
    run_gap_s: float = 900.0,
    refresh: bool = True,
) -> Decision:
    """The decision's evidence; NotFound for an unknown run, ProjectionError for a label outside `scale`.

    `refresh`: catch the projections up first; False under `ledger serve`, whose follower does."""
    if not a or not b:
        raise ProjectionError("decide needs at least one run in each group (--a RUN... --b RUN...)")
    ordered = parse_scale(scale)
    every = [*a, *b]
    runs = list(dict.fromkeys(every))
    columns = {
        run: await run_column(database, run, run_gap_s, refresh=refresh and i == 0) for i, run in enumerate(runs)
    }
    # after the runs are found: an unknown run is the first thing to say (404)
    if repeated := sorted({run for run in every if every.count(run) > 1}):
        raise ProjectionError(f"run {', '.join(map(repr, repeated))} given more than once (each run in one group)")
    labels = await recorded_labels(database, runs)
    check_scale(ordered, (label for run in runs for label in labels[run].values()))
    returns = await recorded_returns(database, as_of=as_of)
    dated = _dated(await recorded_return_values(database), as_of)
    notes: list[str] = []
    group_a = _group(a, columns, labels, ordered, returns, dated, notes)
    group_b = _group(b, columns, labels, ordered, returns, dated, notes)
    pairs = list(itertools.product(a, b))
    qwk, rate = _pairs(pairs, labels, ordered, notes)
    qwk_evidence, rate_evidence = pair_evidence(pairs, labels, ordered)
    between = Between(
        qwk=qwk,
        agree_rate=rate,
        flipped=_flipped(a, b, labels, ordered),
        evidence={"qwk": qwk_evidence, "agree_rate": rate_evidence},
    )
    unmeasured = _unmeasured({"a": a, "b": b}, columns, labels, returns, as_of) + notes
    return Decision(
        a=group_a,
        b=group_b,
        between=between,
        unmeasured=unmeasured,
        within_noise=within_noise(group_a.evidence, group_b.evidence),
    )


def _dated(values: dict[tuple[str, date | None], float], as_of: date | None) -> dict[date, dict[str, float]]:
    """The returns by their `as_of` date (on or before `as_of` when asked); undated ones are no date's."""
    dated: dict[date, dict[str, float]] = {}
    for (key, when), value in values.items():
        if when is not None and (as_of is None or when <= as_of):
            dated.setdefault(when, {})[key] = value
    return dated
