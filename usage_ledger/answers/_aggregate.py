"""Per-run totals, shared by the runs and tickers reports: one SQL aggregate for both kinds of run.

A tagged run is the calls of one `run` tag. Untagged calls, in start order, are cut into runs wherever
a call starts more than `run_gap_s` after every earlier call's start and end; each such run is named
`auto-<first start, UTC, ISO seconds>`. The cuts are a window over the calls read model, so an untagged
run is summed by the very query a tagged one is, grouped by its first start instead of its tag.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    Integer,
    and_,
    case,
    cast,
    func,
    literal_column,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from usage_ledger.ledger.schema import seconds_between
from usage_ledger.projections import FAILED_STATUSES, NO_END_STATUS, TRUNCATED_REASONS, RunSpan, RunStats, SpecBlocks
from usage_ledger.projections.tables import calls

__all__ = ("AUTO_PREFIX", "RunAcc", "collect_runs", "run_filter")

AUTO_PREFIX = "auto-"

Where = Sequence[ColumnElement[bool]]
# what a run's totals read of a call (`_accumulate`)
_ROW_COLUMNS = (
    "model",
    "ticker",
    "status",
    "started_at",
    "ended_at",
    "elapsed_s",
    "input_tokens",
    "output_tokens",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_steps",
    "finish_reason",
)


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


Runs = dict[Any, RunAcc]


def _sum(column: Any) -> Any:
    return cast(func.coalesce(func.sum(column), 0), BigInteger)


def _count(condition: ColumnElement[bool]) -> Any:
    return _sum(case((condition, 1), else_=0))


async def _accumulate(conn: AsyncConnection, c: Any, key: Any, where: Where, *, every_run: bool = False) -> Runs:
    """The one definition of a run's totals: the calls in `c` (columns of the calls read model) matching
    `where`, grouped by `key`, their run. One statement (totals, then per model, per ticker), so that
    what `key` is read from is worked out once. `every_run`: runs without a call matching `where` too,
    empty."""
    ok = c.status == "ok"
    rate = case((and_(ok, c.elapsed_s > 0), c.output_tokens / c.elapsed_s), else_=None)
    spec = [case((ok, v), else_=None) for v in (c.spec_draft_tokens, c.spec_accepted_tokens, c.spec_steps)]
    totals = select(
        literal_column("0"),
        key,
        null(),
        func.count(),
        _sum(c.input_tokens),
        _sum(c.output_tokens),
        _count(c.status.in_(FAILED_STATUSES)),
        _count(c.status == NO_END_STATUS),
        func.min(c.started_at),
        func.max(c.started_at),
        func.max(c.ended_at),
        func.sum(rate),
        cast(func.count(rate), Integer),
        cast(func.count(spec[2]), Integer),  # over the ok calls: how many have a block, Σ of each counter
        *(_sum(v) for v in spec),
        cast(func.count(c.finish_reason), Integer),
        _count(c.finish_reason.in_(TRUNCATED_REASONS)),
    )
    rest = [null()] * (len(totals.selected_columns) - 6)
    models = select(literal_column("1"), key, c.model, func.count(), null(), null(), *rest)
    tickers = select(
        literal_column("2"), key, c.ticker, func.count(), _sum(c.input_tokens), _sum(c.output_tokens), *rest
    )
    parts = [
        totals.where(*where).group_by(key),
        models.where(*where).group_by(key, c.model),
        tickers.where(*where, c.ticker.is_not(None)).group_by(key, c.ticker),
    ]
    if every_run:
        parts.append(select(literal_column("3"), key, *[null()] * (len(rest) + 4)).group_by(key))
    runs: Runs = {}
    for kind, run, label, count, tin, tout, *r in sorted(
        await conn.execute(union_all(*parts)), key=lambda r: int(r[0])
    ):
        if int(kind) == 3:
            runs.setdefault(run, RunAcc())
        elif int(kind) == 1:
            runs[run].models[label] = int(count)
        elif int(kind) == 2:
            runs[run].tickers[label] = [int(count), int(tin), int(tout)]
        else:
            acc = runs[run] = RunAcc()
            acc.calls, acc.input, acc.output, acc.failed, acc.incomplete = (int(v) for v in (count, tin, tout, *r[:2]))
            acc.first_start, acc.last_start, acc.last_end = r[2:5]
            acc.rate_sum, acc.rate_calls = float(r[5] or 0.0), int(r[6])
            acc.spec = [int(v) for v in r[7:11]]
            acc.reasoned, acc.truncated = int(r[11]), int(r[12])
    return runs


async def _tagged(conn: AsyncConnection, version: int, run: str | None, selected: Where) -> Runs:
    where = [calls.c.version == version, calls.c.run.is_not(None), *selected]
    if run is not None:
        where.append(calls.c.run == run)
    return await _accumulate(conn, calls.c, calls.c.run, where)


def auto_name(first_start: datetime) -> str:
    return AUTO_PREFIX + first_start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gap_runs(version: int, run_gap_s: float, selected: Where) -> CTE:
    """The untagged calls, each with `first`, the first start of its run, and `chosen`: whether it
    matches `selected`. A call opens a run when it starts more than `run_gap_s` after every earlier
    call's start and end, so calls that start together are never cut apart: the windows need only the
    start order of the index."""
    c = calls.c
    latest = case((c.ended_at > c.started_at, c.ended_at), else_=c.started_at)
    seen = (
        select(
            *(c[name] for name in _ROW_COLUMNS),
            (case((and_(*selected), 1), else_=0) if selected else literal_column("1")).label("chosen"),
            func.max(latest).over(order_by=c.started_at, rows=(None, -1)).label("horizon"),
        )
        .where(c.version == version, c.run.is_(None))
        .subquery()
    )
    s = seen.c
    opens = seconds_between(s.started_at, s.horizon) > run_gap_s
    if run_gap_s >= 0:  # then only a call after the horizon can: comparing moments spares most calls the arithmetic
        opens = and_(s.started_at > s.horizon, opens)
    # the latest first start so far, calls that start together included (the default frame)
    first = func.max(case((or_(s.horizon.is_(None), opens), s.started_at))).over(order_by=s.started_at)
    return select(*(s[name] for name in (*_ROW_COLUMNS, "chosen")), first.label("first")).cte("gap_runs")


async def _untagged(conn: AsyncConnection, version: int, run_gap_s: float, selected: Where) -> Runs:
    """Gap-cut runs of the untagged calls; with `selected`, runs are cut and named over all calls (names
    do not depend on a filter) and accumulate only the selected ones."""
    rows = _gap_runs(version, run_gap_s, selected)
    chosen = [rows.c.chosen == 1] if selected else []
    by_first = await _accumulate(conn, rows.c, rows.c.first, chosen, every_run=bool(selected))
    runs: Runs = {}
    names: set[str] = set()
    for first in sorted(by_first):
        name = auto_name(first)
        while name in names:  # another run started in the same second
            name += "+"
        names.add(name)
        if by_first[first].calls:
            runs[name] = by_first[first]
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
