"""Per-run accumulation, shared by the runs and tickers reports.

Tagged runs are aggregated in SQL (GROUP BY run). Untagged calls are streamed in start order and
cut into runs wherever the idle gap (start - latest end so far) exceeds `run_gap_s`; each such run
is named `auto-<first start, UTC, ISO seconds>`. Memory holds one accumulator per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Integer, and_, case, cast, func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from usage_ledger.projections import FAILED_STATUSES, NO_END_STATUS, TRUNCATED_REASONS, RunSpan, RunStats, SpecBlocks
from usage_ledger.projections.tables import calls

__all__ = ("AUTO_PREFIX", "RunAcc", "collect_runs", "run_filter")

_SPEC_COLUMNS = (calls.c.spec_draft_tokens, calls.c.spec_accepted_tokens, calls.c.spec_steps)

AUTO_PREFIX = "auto-"


class RunAcc:
    __slots__ = (
        "calls",
        "failed",
        "first_start",
        "incomplete",
        "input",
        "last_end",
        "last_start",
        "models",
        "output",
        "rate_calls",
        "rate_sum",
        "reasoned",
        "spec",
        "tickers",
        "truncated",
    )

    def __init__(self) -> None:
        self.calls = self.failed = self.incomplete = self.input = self.output = self.rate_calls = 0
        self.reasoned = self.truncated = 0
        """Calls with a finish reason; of those, cut at their token limit (`call_rules.TRUNCATED_REASONS`)."""
        self.rate_sum = 0.0
        self.first_start: datetime | None = None
        self.last_start: datetime | None = None
        self.last_end: datetime | None = None
        self.models: dict[str | None, int] = {}
        self.tickers: dict[str, list[int]] = {}
        self.spec = [0, 0, 0, 0]
        """Over the ok calls with a speculative-decoding block: how many, Σ draft, Σ accepted, Σ steps."""

    def spec_blocks(self) -> SpecBlocks | None:
        """The sums of the per-request blocks when every ok call has one (and there is one), else None."""
        ok = self.completed()
        calls, draft, accepted, steps = self.spec
        if not ok or calls != ok:
            return None
        return SpecBlocks(calls=calls, draft_tokens=draft, accepted_tokens=accepted, steps=steps)

    def completed(self) -> int:
        """Calls that completed (status `ok`): what the server counts as requests."""
        return self.calls - self.failed - self.incomplete

    def span(self, name: str) -> RunSpan | None:
        """The run as the server counts it (`projections.reconcile`); None for a run without calls."""
        if self.first_start is None:
            return None
        ends = [t for t in (self.last_end, self.last_start) if t is not None]
        return RunSpan(
            run=name,
            started_at=self.first_start,
            ended_at=max(ends, default=self.first_start),
            requests=self.completed(),
            prompt_tokens=self.input,
            generation_tokens=self.output,
        )

    def truncated_calls(self) -> int | None:
        """Calls whose answer was cut; None when no call of the run says how it finished."""
        return self.truncated if self.reasoned else None

    def stats(self) -> RunStats:
        return RunStats(
            calls=self.calls,
            completed_calls=self.completed(),
            output_tokens=self.output,
            input_tokens=self.input,
            first_start=self.first_start,
            last_end=self.last_end,
            rate_sum=self.rate_sum,
            rate_calls=self.rate_calls,
        )

    def model(self) -> str | None:
        named = [(n, m) for m, n in self.models.items() if m is not None]
        if not named:
            return None
        best = max(n for n, _ in named)
        return min(m for n, m in named if n == best)


def _int_sum(column: Any) -> Any:
    return cast(func.coalesce(func.sum(column), 0), BigInteger)


def _spec_sums() -> list[Any]:
    """Over the ok calls: how many have a block, and Σ of each of its counters (`RunAcc.spec`)."""
    of_ok = [case((calls.c.status == "ok", column), else_=None) for column in _SPEC_COLUMNS]
    return [cast(func.count(of_ok[2]), Integer), *(_int_sum(column) for column in of_ok)]


def _rate() -> Any:
    return case(
        (and_(calls.c.status == "ok", calls.c.elapsed_s > 0), calls.c.output_tokens / calls.c.elapsed_s), else_=None
    )


async def _tagged(
    conn: AsyncConnection, version: int, run: str | None, selected: Sequence[ColumnElement[bool]]
) -> dict[str, RunAcc]:
    where: list[ColumnElement[bool]] = [calls.c.version == version, calls.c.run.is_not(None), *selected]
    if run is not None:
        where.append(calls.c.run == run)
    failed = _int_sum(case((calls.c.status.in_(FAILED_STATUSES), 1), else_=0))
    incomplete = _int_sum(case((calls.c.status == NO_END_STATUS, 1), else_=0))
    query = (
        select(
            calls.c.run,
            func.count(),
            failed,
            incomplete,
            _int_sum(calls.c.input_tokens),
            _int_sum(calls.c.output_tokens),
            func.min(calls.c.started_at),
            func.max(calls.c.started_at),
            func.max(calls.c.ended_at),
            func.sum(_rate()),
            cast(func.count(_rate()), Integer),
            *_spec_sums(),
            cast(func.count(calls.c.finish_reason), Integer),
            _int_sum(case((calls.c.finish_reason.in_(TRUNCATED_REASONS), 1), else_=0)),
        )
        .where(*where)
        .group_by(calls.c.run)
    )
    runs: dict[str, RunAcc] = {}
    for r in await conn.execute(query):
        acc = runs[r[0]] = RunAcc()
        acc.calls, acc.failed, acc.incomplete, acc.input, acc.output = (int(r[i]) for i in range(1, 6))
        acc.first_start, acc.last_start, acc.last_end = r[6], r[7], r[8]
        acc.rate_sum, acc.rate_calls = float(r[9] or 0.0), int(r[10])
        acc.spec = [int(v) for v in r[11:15]]
        acc.reasoned, acc.truncated = int(r[15]), int(r[16])
    if not runs:
        return runs
    models = select(calls.c.run, calls.c.model, func.count()).where(*where).group_by(calls.c.run, calls.c.model)
    for r in await conn.execute(models):
        runs[r[0]].models[r[1]] = int(r[2])
    tickers = (
        select(
            calls.c.run,
            calls.c.ticker,
            func.count(),
            _int_sum(calls.c.input_tokens),
            _int_sum(calls.c.output_tokens),
        )
        .where(*where, calls.c.ticker.is_not(None))
        .group_by(calls.c.run, calls.c.ticker)
    )
    for r in await conn.execute(tickers):
        runs[r[0]].tickers[r[1]] = [int(r[2]), int(r[3]), int(r[4])]
    return runs


def auto_name(first_start: datetime) -> str:
    return AUTO_PREFIX + first_start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _untagged(
    conn: AsyncConnection, version: int, run_gap_s: float, selected: Sequence[ColumnElement[bool]]
) -> dict[str, RunAcc]:
    """Gap-cut runs of the untagged calls; with `selected`, runs are cut over all calls (names do not
    depend on a filter) and accumulate only the selected ones."""
    c = calls.c
    chosen = case((and_(*selected), 1), else_=0) if selected else literal(1)
    query = (
        select(
            c.started_at,
            c.ended_at,
            c.status,
            c.input_tokens,
            c.output_tokens,
            c.elapsed_s,
            c.ticker,
            c.model,
            chosen,
            *_SPEC_COLUMNS,
            c.finish_reason,
        )
        .where(c.version == version, c.run.is_(None))
        .order_by(c.started_at, c.call_id)
    )
    runs: dict[str, RunAcc] = {}
    names: set[str] = set()
    name = ""
    acc: RunAcc | None = None
    horizon: datetime | None = None
    result = await conn.stream(query)
    async for part in result.partitions(5000):
        for started, ended, status, tin, tout, elapsed, ticker, model, keep, draft, accepted, steps, reason in part:
            if horizon is None or (started - horizon).total_seconds() > run_gap_s:
                name = auto_name(started)
                while name in names:
                    name += "+"
                names.add(name)
                acc = None
                horizon = started
            horizon = max(horizon, ended or started)
            if not keep:
                continue
            if acc is None:
                acc = runs[name] = RunAcc()
                acc.first_start = started
            acc.calls += 1
            acc.input += tin
            acc.output += tout
            acc.last_start = started
            if ended is not None and (acc.last_end is None or ended > acc.last_end):
                acc.last_end = ended
            if status in FAILED_STATUSES:
                acc.failed += 1
            elif status == NO_END_STATUS:
                acc.incomplete += 1
            elif status == "ok":
                if elapsed and elapsed > 0:
                    acc.rate_sum += tout / elapsed
                    acc.rate_calls += 1
                if steps is not None:
                    spec = acc.spec
                    spec[0] += 1
                    spec[1] += draft
                    spec[2] += accepted
                    spec[3] += steps
            if reason is not None:
                acc.reasoned += 1
                acc.truncated += reason in TRUNCATED_REASONS
            acc.models[model] = acc.models.get(model, 0) + 1
            if ticker is not None:
                t = acc.tickers.setdefault(ticker, [0, 0, 0])
                t[0] += 1
                t[1] += tin
                t[2] += tout
    return runs


async def collect_runs(
    conn: AsyncConnection,
    version: int,
    *,
    run: str | None = None,
    run_gap_s: float = 900.0,
    selected: Sequence[ColumnElement[bool]] = (),
) -> dict[str, RunAcc]:
    """Accumulators of every run (or just `run`), tagged and gap-grouped; only calls matching `selected`."""
    runs = await _tagged(conn, version, run, selected)
    if run is None or (not runs and run.startswith(AUTO_PREFIX)):
        auto = await _untagged(conn, version, run_gap_s, selected)
        if run is not None:
            auto = {name: acc for name, acc in auto.items() if name == run}
        runs.update(auto)
    return runs


async def run_filter(conn: AsyncConnection, version: int, run: str, run_gap_s: float) -> ColumnElement[bool] | None:
    """A WHERE clause selecting the calls of `run` (tagged or `auto-…`), or None if there is no such run."""
    runs = await collect_runs(conn, version, run=run, run_gap_s=run_gap_s)
    acc = runs.get(run)
    if acc is None:
        return None
    if not run.startswith(AUTO_PREFIX) or acc.first_start is None or acc.last_start is None:
        return calls.c.run == run
    tagged = (await conn.execute(select(func.count()).where(calls.c.version == version, calls.c.run == run))).scalar()
    if tagged:
        return calls.c.run == run
    return and_(calls.c.run.is_(None), calls.c.started_at >= acc.first_start, calls.c.started_at <= acc.last_start)
