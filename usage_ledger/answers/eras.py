"""`ledger report eras --by LABEL`: runs grouped by an annotation label, e.g. one row per GPU era.

A run's group is its value of the label (`ledger annotate --run R --hardware …`, or any label);
for `model`, a run without the label falls back to its calls' model. Runs without a value form
the group `null`. `--kind KIND` keeps the runs labelled `kind=KIND`. Throughput is each run's under
the formula (the promoted one unless given), so the same runs give different eras per formula.

The throughput and wall figures rest on the runs that delivered something (`measured_runs`): a run with
no completed call, or no throughput under the formula, is counted in `runs` and in `left_out` with why,
never as 0 tok/s in a mean.
"""

from __future__ import annotations

import statistics
from collections import Counter
from zoneinfo import ZoneInfo

import msgspec

from usage_ledger.answers.filters import NO_FILTER, CallFilter
from usage_ledger.answers.reports import runs_report
from usage_ledger.answers.zones import in_zone
from usage_ledger.ledger import Database
from usage_ledger.projections import CostMeans, RunRow, cost_means

__all__ = ("EraRow", "era_of", "eras_report", "group_of", "left_out_reason", "measured_runs")


class EraRow(msgspec.Struct, frozen=True, kw_only=True):
    group: str | None
    runs: int
    measured_runs: int = 0
    """The runs the throughput and wall figures rest on."""
    left_out: dict[str, int] = {}
    """The runs left out of those figures, counted by why (`left_out_reason`)."""
    days: int
    """Distinct local days (in the report's zone) on which the group's runs started."""
    mean_throughput_tps: float | None
    median_throughput_tps: float | None
    min_throughput_tps: float | None
    max_throughput_tps: float | None
    mean_wall_s: float | None
    formula: str
    cost: CostMeans | None = None
    """Means of the measured runs priced (`ledger annotate --price-per-hour`); None: none is, or in mixed currencies."""


def group_of(run: RunRow, label: str) -> str | None:
    value = run.labels.get(label)
    if value is None and label == "model":
        return run.model
    return value


def left_out_reason(completed_calls: int, throughput_tps: float | None, formula: str) -> str | None:
    """Why a run enters no throughput (or per-run time and cost) figure; None when it does."""
    if not completed_calls:
        return "no completed call"
    if throughput_tps is None:
        return f"no throughput under {formula} (no wall time)"
    return None


def measured_runs(runs: list[RunRow]) -> tuple[list[RunRow], Counter[str]]:
    """The runs a throughput figure rests on, and how many were left out by why."""
    kept: list[RunRow] = []
    left: Counter[str] = Counter()
    for run in runs:
        why = left_out_reason(run.calls - run.failed_calls - run.incomplete_calls, run.throughput_tps, run.formula)
        if why is None:
            kept.append(run)
        else:
            left[why] += 1
    return kept, left


def era_of(group: str | None, runs: list[RunRow], zone: ZoneInfo, formula: str) -> EraRow:
    measured, left = measured_runs(runs)
    rates = [r.throughput_tps for r in measured if r.throughput_tps is not None]
    walls = [r.wall_s for r in measured if r.wall_s is not None]
    days = {in_zone(r.started_at, zone).date() for r in runs if r.started_at is not None}
    return EraRow(
        group=group,
        runs=len(runs),
        measured_runs=len(measured),
        left_out=dict(left),
        days=len(days),
        mean_throughput_tps=statistics.fmean(rates) if rates else None,
        median_throughput_tps=statistics.median(rates) if rates else None,
        min_throughput_tps=min(rates) if rates else None,
        max_throughput_tps=max(rates) if rates else None,
        mean_wall_s=statistics.fmean(walls) if walls else None,
        formula=formula,
        cost=cost_means(r.cost for r in measured),
    )


async def eras_report(
    database: Database,
    *,
    by: str,
    kind: str | None = None,
    formula: str | None = None,
    zone: ZoneInfo,
    run_gap_s: float = 900.0,
    filters: CallFilter = NO_FILTER,
) -> list[EraRow]:
    """One row per value of `by`, in order of each group's first run (runs as `filters` leave them)."""
    runs = await runs_report(database, formula=formula, run_gap_s=run_gap_s, filters=filters)
    groups: dict[str | None, list[RunRow]] = {}
    for run in runs:  # runs_report orders by first call start
        if kind is None or run.labels.get("kind") == kind:
            groups.setdefault(group_of(run, by), []).append(run)
    used = runs[0].formula if runs else (formula or "")
    return [era_of(group, members, zone, used) for group, members in groups.items()]
