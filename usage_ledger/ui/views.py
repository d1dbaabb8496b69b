"""What each dashboard page shows, as one Struct per page: the JSON endpoints return these, the
HTML pages render them. Every figure comes from a report function of `projections` or from the
calls projection (ui.series), never computed twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

# eras_report catches up first (no `refresh`): inside `ledger serve` that would run on the gateway's loop,
# so the eras are built here from runs_report(refresh=False) with the module's own grouping rules
from usage_ledger.answers import (
    Comparison,
    EraRow,
    compare_runs,
    daily_report,
    era_of,
    group_of,
    iter_calls,
    metric_values,
    parse_zone,
    runs_report,
    tickers_report,
    weekday_mean,
)
from usage_ledger.projections import FORMULAS, CallView, DailyRow, ReportSettings, RunRow, TickerRow, WeekdayRow
from usage_ledger.ui.queries import run_samples
from usage_ledger.ui.reader import Reader
from usage_ledger.ui.series import (
    Histogram,
    Series,
    ServerSeries,
    histogram,
    in_flight_series,
    output_rate_series,
    server_series,
    token_times_source,
    tpot_values,
    ttft_values,
)

__all__ = (
    "CompareView",
    "DailyView",
    "ErasView",
    "MetricRow",
    "RunView",
    "RunsChart",
    "RunsView",
    "compare_view",
    "daily_view",
    "eras_view",
    "run_view",
    "runs_view",
)

LIVE_WINDOW_S = 60.0
"""A run whose last call ended this recently, or that has a call still open, is shown as in progress."""


class RunsChart(msgspec.Struct, frozen=True, kw_only=True):
    """Throughput of each run at its start, one series per value of `label` (None: runs without it)."""

    label: str
    x: list[float]
    groups: list[str | None]
    y: list[list[float | None]]
    formula: str
    source: str


class RunsView(msgspec.Struct, frozen=True, kw_only=True):
    runs: list[RunRow]
    labels: list[str]
    """Label names the runs carry (ledger annotate), `model` first: what the chart can colour by."""
    chart: RunsChart


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    run: RunRow
    live: bool
    in_flight: Series
    output_rate: Series
    ttft: Histogram
    tpot: Histogram
    tickers: list[TickerRow]
    server: ServerSeries | None


class ErasView(msgspec.Struct, frozen=True, kw_only=True):
    by: str
    labels: list[str]
    groups: list[str | None]
    eras: dict[str, list[EraRow]]
    """Per formula (every registered one), the eras in order of each group's first run."""


class DailyView(msgspec.Struct, frozen=True, kw_only=True):
    tz: str
    days: list[DailyRow]
    weekdays: list[WeekdayRow]


def _label_names(rows: list[RunRow]) -> list[str]:
    return ["model", *sorted({name for row in rows for name in row.labels} - {"model"})]


def _default_label(names: list[str]) -> str:
    return "hardware" if "hardware" in names else "model"


async def runs_view(reader: Reader, *, label: str | None = None, formula: str | None = None) -> RunsView:
    database = await reader.ready()
    rows = await runs_report(database, formula=formula, run_gap_s=reader.settings.run_gap_s, refresh=False)
    names = _label_names(rows)
    label = label or _default_label(names)
    dated = [r for r in rows if r.started_at is not None]
    groups = list(dict.fromkeys(group_of(r, label) for r in dated))
    y = [[r.throughput_tps if group_of(r, label) == g else None for r in dated] for g in groups]
    chart = RunsChart(
        label=label,
        x=[r.started_at.timestamp() for r in dated if r.started_at is not None],
        groups=groups,
        y=y,
        formula=rows[0].formula if rows else (formula or ""),
        source="ledger report runs: throughput_tps at each run's first call start",
    )
    return RunsView(runs=rows, labels=names, chart=chart)


def _is_live(calls: list[CallView], now: datetime, run_gap_s: float) -> bool:
    open_since = now - timedelta(seconds=run_gap_s)
    ended = [c.ended_at for c in calls if c.ended_at is not None]
    if any(c.ended_at is None and c.started_at >= open_since for c in calls):
        return True
    return bool(ended) and max(ended) >= now - timedelta(seconds=LIVE_WINDOW_S)


async def run_view(reader: Reader, run: str, *, formula: str | None = None) -> RunView:
    database = await reader.ready()
    gap = reader.settings.run_gap_s
    (row,) = await runs_report(database, formula=formula, run=run, run_gap_s=gap, refresh=False)
    calls = [view async for view in iter_calls(database, run=run, run_gap_s=gap, refresh=False)]
    tickers = await tickers_report(database, run=run, run_gap_s=gap, refresh=False)
    samples = await run_samples(database, row)
    ttft, tpot = ttft_values(calls), tpot_values(calls)
    return RunView(
        run=row,
        live=_is_live(calls, datetime.now(UTC), gap),
        in_flight=in_flight_series(calls),
        output_rate=output_rate_series(calls),
        ttft=histogram(ttft, unit="s", source=token_times_source("calls projection: ttft_s", len(ttft), calls)),
        tpot=histogram(
            [v * 1000 for v in tpot],
            unit="ms",
            source=token_times_source(
                "(e2e - TTFT) / (output tokens - 1), as ledger compare and vllm bench serve", len(tpot), calls
            ),
        ),
        tickers=tickers,
        server=server_series(samples) if samples else None,
    )


async def eras_view(reader: Reader, *, by: str | None = None, kind: str | None = None) -> ErasView:
    database = await reader.ready()
    settings: ReportSettings = reader.settings
    zone = parse_zone(settings.tz)
    eras: dict[str, list[EraRow]] = {}
    names: list[str] = []
    for formula in sorted(FORMULAS):
        runs = await runs_report(database, formula=formula, run_gap_s=settings.run_gap_s, refresh=False)
        names = _label_names(runs)
        by = by or _default_label(names)
        members: dict[str | None, list[RunRow]] = {}
        for row in runs:  # in order of first call start, as eras_report groups them
            if kind is None or row.labels.get("kind") == kind:
                members.setdefault(group_of(row, by), []).append(row)
        eras[formula] = [era_of(group, rows, zone, formula) for group, rows in members.items()]
    by = by or "model"
    groups = list(dict.fromkeys(row.group for rows in eras.values() for row in rows))
    return ErasView(by=by, labels=names, groups=groups, eras=eras)


async def daily_view(reader: Reader, *, tz: str | None = None, run: str | None = None) -> DailyView:
    database = await reader.ready()
    zone = tz or reader.settings.tz
    days = await daily_report(database, tz=zone, run=run, run_gap_s=reader.settings.run_gap_s, refresh=False)
    return DailyView(tz=zone, days=days, weekdays=weekday_mean(days))


class MetricRow(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    values: list[float | None]
    """One per run, in the order asked."""
    ratios: list[float | None]
    """Each run after the first divided by the first."""


class CompareView(msgspec.Struct, frozen=True, kw_only=True):
    runs: list[str]
    """Every run in the ledger, to pick from."""
    picked: list[str]
    comparison: Comparison | None
    metrics: list[MetricRow]


async def compare_view(reader: Reader, picked: list[str]) -> CompareView:
    """`ledger compare RUN RUN …` (answers.compare) for the runs picked, metrics as rows."""
    database = await reader.ready()
    gap = reader.settings.run_gap_s
    names = [row.run for row in await runs_report(database, run_gap_s=gap, refresh=False)]
    picked = list(dict.fromkeys(picked))
    if len(picked) < 2:
        return CompareView(runs=names, picked=picked, comparison=None, metrics=[])
    comparison = await compare_runs(database, picked, run_gap_s=gap, refresh=False)  # `reader.ready` refreshed
    columns = [metric_values(run) for run in comparison.runs]
    metrics = [
        MetricRow(
            name=name,
            values=[column[name] for column in columns],
            ratios=[ratio.values.get(name) for ratio in comparison.ratios],
        )
        for name in columns[0]
    ]
    return CompareView(runs=names, picked=picked, comparison=comparison, metrics=metrics)
