"""Reports over the live projections: runs, tickers, daily totals, formula comparisons.

Each function refreshes the projections first (catch-up to the head) unless `refresh=False`
(the API passes False: `ledger serve` runs `ledger projections run --follow` beside it, in a child process).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import UTC, date, datetime

from sqlalchemy import BigInteger, case, cast, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.answers._aggregate import RunAcc, collect_runs
from usage_ledger.answers.filters import NO_FILTER, CallFilter, calls_where, filter_clauses
from usage_ledger.answers.zones import in_zone, parse_zone
from usage_ledger.ledger import Database, ServerSampled
from usage_ledger.projections import (
    FAILED_STATUSES,
    REPLAY_LABEL,
    CallsPerTicker,
    DailyRow,
    NotFound,
    RecomputeRow,
    RunRow,
    ServerTraffic,
    TickerRow,
    WeekdayRow,
    catch_up_all,
    get_formula,
    labels_for_run,
    live_version,
    load_annotations,
    load_samples,
    run_cost,
    samples_of_run,
    server_block,
)
from usage_ledger.projections.tables import calls

__all__ = (
    "daily_report",
    "live_versions",
    "recompute_report",
    "runs_report",
    "tickers_report",
    "weekday_mean",
)

_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# Every UTC offset in use is a multiple of 15 minutes, so a 15-minute UTC bucket lies within one local day.
_BUCKET_S = 900


async def live_versions(database: Database, *, refresh: bool = True) -> tuple[int, int, str]:
    """(calls version, annotations version, default formula), after catching up when `refresh`."""
    if refresh:
        await catch_up_all(database)
    async with database.engine.connect() as conn:
        calls_version, formula = await live_version(conn, "calls")
        notes_version, _ = await live_version(conn, "annotations")
    return calls_version, notes_version, formula


def _tickers_done(acc: RunAcc, whole: dict[str, list[int]] | None) -> tuple[float | None, bool]:
    """(tickers counted by calls done, whether the run is partial) against `whole`, the tickers of the run
    it replays: a ticker with 2 of its 17 calls is 2/17 of one, not a whole one."""
    if whole is None:
        return (float(len(acc.tickers)) if acc.tickers else None), False
    done = sum(min(1.0, t[0] / whole[k][0]) if k in whole else 1.0 for k, t in acc.tickers.items())
    partial = acc.calls < sum(t[0] for t in whole.values()) or any(k not in acc.tickers for k in whole)
    return (done if acc.tickers else None), partial


def _run_row(
    name: str,
    acc: RunAcc,
    formula: str,
    labels: dict[str, str],
    samples: Sequence[ServerSampled],
    traffic: ServerTraffic,
    whole: dict[str, list[int]] | None,
) -> RunRow:
    stats = acc.stats()
    counts = sorted(t[0] for t in acc.tickers.values())
    wall = stats.wall_s
    tickers = len(counts)
    done, partial = _tickers_done(acc, whole)
    hours = wall / 3600 * 100 / done if wall is not None and done and acc.completed() else None
    return RunRow(
        run=name,
        model=acc.model(),
        calls=acc.calls,
        failed_calls=acc.failed,
        incomplete_calls=acc.incomplete,
        truncated_calls=acc.truncated_calls(),
        tickers=tickers,
        input_tokens=acc.input,
        output_tokens=acc.output,
        started_at=acc.first_start,
        ended_at=acc.last_end,
        wall_s=wall,
        throughput_tps=get_formula(formula)(stats),
        formula=formula,
        calls_per_ticker=(
            CallsPerTicker(min=counts[0], median=float(statistics.median(counts)), max=counts[-1]) if counts else None
        ),
        hours_per_100_tickers=hours,
        tickers_done=done,
        partial=partial,
        cost=run_cost(labels, wall, hours, acc.output),
        labels=labels,
        server=server_block(
            samples_of_run(samples, name),
            acc.first_start,
            acc.last_end,
            check=traffic.check(name),
            spec_blocks=acc.spec_blocks(),
        ),
    )


def _order(item: tuple[str, RunAcc]) -> tuple[datetime, str]:
    return (item[1].first_start or datetime.min.replace(tzinfo=UTC), item[0])


async def runs_report(
    database: Database,
    *,
    formula: str | None = None,
    run: str | None = None,
    run_gap_s: float = 900.0,
    refresh: bool = True,
    filters: CallFilter = NO_FILTER,
) -> list[RunRow]:
    """One row per run (DESIGN §6) with calls matching `filters`, ordered by first call start."""
    if formula is not None:
        get_formula(formula)
    version, notes_version, default = await live_versions(database, refresh=refresh)
    formula = formula or default
    async with database.engine.connect() as conn:
        runs = await collect_runs(conn, version, run=run, run_gap_s=run_gap_s, selected=filter_clauses(filters))
        notes = await load_annotations(conn, notes_version)
        samples = await load_samples(conn)
        if run is not None and not runs:
            await _require_run(conn, version, run, run_gap_s, filters)
        traffic = await _traffic(
            conn, version, run_gap_s, samples, runs if run is None and not filters.active else None
        )
        labels = {name: labels_for_run(notes, name, acc.first_start) for name, acc in runs.items()}
        replayed = {name: found for name in runs if (found := labels[name].get(REPLAY_LABEL)) is not None}
        wholes = await _wholes(conn, version, run_gap_s, set(replayed.values()))
    return [
        _run_row(name, acc, formula, labels[name], samples, traffic, wholes.get(replayed.get(name, "")))
        for name, acc in sorted(runs.items(), key=_order)
    ]


async def _wholes(
    conn: AsyncConnection, version: int, run_gap_s: float, runs: set[str]
) -> dict[str, dict[str, list[int]]]:
    """The tickers (calls, input, output) of each run replayed, all of its calls whatever the report's filters."""
    out: dict[str, dict[str, list[int]]] = {}
    for run in sorted(runs):
        found = await collect_runs(conn, version, run=run, run_gap_s=run_gap_s)
        if run in found and found[run].tickers:
            out[run] = found[run].tickers
    return out


async def _traffic(
    conn: AsyncConnection,
    version: int,
    run_gap_s: float,
    samples: Sequence[ServerSampled],
    every: dict[str, RunAcc] | None,
) -> ServerTraffic:
    """Every recorded run against the servers sampled (`every`: all runs, unfiltered, when already collected).

    A reconciliation window holds whatever calls fall in it, so it needs every run, whatever the report shows."""
    if samples and every is None:
        every = await collect_runs(conn, version, run_gap_s=run_gap_s)
    spans = [span for name, acc in (every or {}).items() if (span := acc.span(name)) is not None]
    return ServerTraffic(samples, spans)


async def _require_run(conn: AsyncConnection, version: int, run: str, run_gap_s: float, filters: CallFilter) -> None:
    """NotFound unless `run` exists: a filter may leave an existing run without calls (then the report is empty)."""
    if not filters.active or not await collect_runs(conn, version, run=run, run_gap_s=run_gap_s):
        raise NotFound(f"no run {run!r} in the ledger (see `ledger report runs`)")


async def tickers_report(
    database: Database,
    *,
    run: str | None = None,
    run_gap_s: float = 900.0,
    refresh: bool = True,
    filters: CallFilter = NO_FILTER,
) -> list[TickerRow]:
    """Calls and tokens per run and ticker (of the calls matching `filters`)."""
    version, _, _ = await live_versions(database, refresh=refresh)
    async with database.engine.connect() as conn:
        runs = await collect_runs(conn, version, run=run, run_gap_s=run_gap_s, selected=filter_clauses(filters))
        if run is not None and not runs:
            await _require_run(conn, version, run, run_gap_s, filters)
    return [
        TickerRow(run=name, ticker=ticker, calls=t[0], input_tokens=t[1], output_tokens=t[2])
        for name, acc in sorted(runs.items(), key=_order)
        for ticker, t in sorted(acc.tickers.items())
    ]


async def recompute_report(
    database: Database,
    formula: str,
    *,
    run_gap_s: float = 900.0,
    refresh: bool = True,
) -> list[RecomputeRow]:
    """Every run under the promoted and the `formula` given, side by side."""
    new = get_formula(formula)
    version, _, old_name = await live_versions(database, refresh=refresh)
    old = get_formula(old_name)
    async with database.engine.connect() as conn:
        runs = await collect_runs(conn, version, run_gap_s=run_gap_s)
    out = []
    for name, acc in sorted(runs.items(), key=_order):
        stats = acc.stats()
        before, after = old(stats), new(stats)
        change = (after - before) / before * 100 if before and after is not None else None
        out.append(
            RecomputeRow(
                run=name, old_formula=old_name, old_tps=before, new_formula=formula, new_tps=after, change_pct=change
            )
        )
    return out


async def daily_report(
    database: Database,
    *,
    tz: str = "UTC",
    run: str | None = None,
    run_gap_s: float = 900.0,
    refresh: bool = True,
    filters: CallFilter = NO_FILTER,
) -> list[DailyRow]:
    """Calls, failures and tokens per calendar day in `tz` (by call start, of calls matching `filters`), DST-correct.

    SQL sums per 15-minute UTC bucket; each bucket is then mapped to its local date with zoneinfo.
    """
    zone = parse_zone(tz)
    version, _, _ = await live_versions(database, refresh=refresh)
    async with database.engine.connect() as conn:
        where = await calls_where(conn, version, run, run_gap_s, filters)
        bucket = database.backend_ops.epoch_bucket(calls.c.started_at, _BUCKET_S).label("bucket")
        query = (
            select(
                bucket,
                func.count(),
                cast(func.sum(case((calls.c.status.in_(FAILED_STATUSES), 1), else_=0)), BigInteger),
                cast(func.sum(calls.c.input_tokens), BigInteger),
                cast(func.sum(calls.c.output_tokens), BigInteger),
            )
            .where(*where)
            .group_by(bucket)
        )
        days: dict[date, list[int]] = {}
        for b, n, failed, tin, tout in await conn.execute(query):
            day = in_zone(datetime.fromtimestamp(int(b) * _BUCKET_S, UTC), zone).date()
            acc = days.setdefault(day, [0, 0, 0, 0])
            acc[0] += int(n)
            acc[1] += int(failed)
            acc[2] += int(tin)
            acc[3] += int(tout)
    return [
        DailyRow(day=day.isoformat(), calls=v[0], failed_calls=v[1], input_tokens=v[2], output_tokens=v[3])
        for day, v in sorted(days.items())
    ]


def weekday_mean(rows: list[DailyRow]) -> list[WeekdayRow]:
    """Mean per day of each weekday (over days with calls), plus `Mon-Fri` for the average working day."""
    groups: dict[str, list[DailyRow]] = {}
    for row in rows:
        weekday = date.fromisoformat(row.day).weekday()
        groups.setdefault(_WEEKDAYS[weekday], []).append(row)
        if weekday < 5:
            groups.setdefault("Mon-Fri", []).append(row)
    out = []
    for name in (*_WEEKDAYS, "Mon-Fri"):
        days = groups.get(name)
        if not days:
            continue
        n = len(days)
        out.append(
            WeekdayRow(
                weekday=name,
                days=n,
                calls=sum(d.calls for d in days) / n,
                failed_calls=sum(d.failed_calls for d in days) / n,
                input_tokens=sum(d.input_tokens for d in days) / n,
                output_tokens=sum(d.output_tokens for d in days) / n,
            )
        )
    return out
