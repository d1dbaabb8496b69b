"""Per-run totals, shared by the runs and tickers reports: one SQL aggregate for both kinds of run.

A tagged run is the calls of one `run` tag. Untagged calls, in start order, are cut into runs wherever
a call starts more than `run_gap_s` after the latest end so far (a call without an end counts its
start); each such run is named `auto-<first start, UTC, ISO seconds>`. The cut is a window over the
calls read model, so an untagged run is summed by the very query a tagged one is, grouped by its number.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Integer, Subquery, and_, case, cast, func, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from usage_ledger.ledger.schema import seconds_between
from usage_ledger.projections import FAILED_STATUSES, NO_END_STATUS, TRUNCATED_REASONS, RunSpan, RunStats, SpecBlocks
from usage_ledger.projections.tables import calls

__all__ = ("AUTO_PREFIX", "RunAcc", "collect_runs", "run_filter")

AUTO_PREFIX = "auto-"

Where = Sequence[ColumnElement[bool]]
# what a run's totals read of a call (`_accumulate`), and the order runs are cut in
_ROW_COLUMNS = (
    "call_id",
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


async def _accumulate(conn: AsyncConnection, c: Any, key: Any, where: Where) -> Runs:
    """The one definition of a run's totals: the calls in `c` (columns of the calls read model) matching
    `where`, grouped by `key`, their run."""
    ok = c.status == "ok"
    rate = case((and_(ok, c.elapsed_s > 0), c.output_tokens / c.elapsed_s), else_=None)
    spec = [case((ok, v), else_=None) for v in (c.spec_draft_tokens, c.spec_accepted_tokens, c.spec_steps)]
    totals = select(
        key,
        func.count(),
        _count(c.status.in_(FAILED_STATUSES)),
        _count(c.status == NO_END_STATUS),
        _sum(c.input_tokens),
        _sum(c.output_tokens),
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
    runs: Runs = {}
    for r in await conn.execute(totals.where(*where).group_by(key)):
        acc = runs[r[0]] = RunAcc()
        acc.calls, acc.failed, acc.incomplete, acc.input, acc.output = (int(r[i]) for i in range(1, 6))
        acc.first_start, acc.last_start, acc.last_end = r[6], r[7], r[8]
        acc.rate_sum, acc.rate_calls = float(r[9] or 0.0), int(r[10])
        acc.spec = [int(v) for v in r[11:15]]
        acc.reasoned, acc.truncated = int(r[15]), int(r[16])
    if not runs:
        return runs
    for r in await conn.execute(select(key, c.model, func.count()).where(*where).group_by(key, c.model)):
        runs[r[0]].models[r[1]] = int(r[2])
    tickers = select(key, c.ticker, func.count(), _sum(c.input_tokens), _sum(c.output_tokens))
    for r in await conn.execute(tickers.where(*where, c.ticker.is_not(None)).group_by(key, c.ticker)):
        runs[r[0]].tickers[r[1]] = [int(r[2]), int(r[3]), int(r[4])]
    return runs


async def _tagged(conn: AsyncConnection, version: int, run: str | None, selected: Where) -> Runs:
    where = [calls.c.version == version, calls.c.run.is_not(None), *selected]
    if run is not None:
        where.append(calls.c.run == run)
    return await _accumulate(conn, calls.c, calls.c.run, where)


def auto_name(first_start: datetime) -> str:
    return AUTO_PREFIX + first_start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gap_runs(version: int, run_gap_s: float, selected: Where) -> Subquery:
    """The untagged calls, each with `number`, its run's place in start order, and `chosen`: whether
    it matches `selected`."""
    c = calls.c
    order = (c.started_at, c.call_id)
    seen = (
        select(
            *(c[name] for name in _ROW_COLUMNS),
            (case((and_(*selected), 1), else_=0) if selected else literal(1)).label("chosen"),
            func.max(func.coalesce(c.ended_at, c.started_at)).over(order_by=order, rows=(None, -1)).label("horizon"),
        )
        .where(c.version == version, c.run.is_(None))
        .subquery()
    )
    s = seen.c
    cut = case((or_(s.horizon.is_(None), seconds_between(s.started_at, s.horizon) > run_gap_s), 1), else_=0)
    number = func.sum(cut).over(order_by=(s.started_at, s.call_id), rows=(None, 0))
    return select(seen, number.label("number")).subquery()


async def _untagged(conn: AsyncConnection, version: int, run_gap_s: float, selected: Where) -> Runs:
    """Gap-cut runs of the untagged calls; with `selected`, runs are cut and named over all calls (names
    do not depend on a filter) and accumulate only the selected ones."""
    rows = _gap_runs(version, run_gap_s, selected)
    numbered = await _accumulate(conn, rows.c, rows.c.number, [rows.c.chosen == 1] if selected else [])
    if selected:
        every = select(rows.c.number, func.min(rows.c.started_at)).group_by(rows.c.number)
        firsts = {number: first for number, first in await conn.execute(every)}
    else:
        firsts = {number: acc.first_start for number, acc in numbered.items()}
    runs: Runs = {}
    names: set[str] = set()
    for number in sorted(firsts):
        name = auto_name(firsts[number])
        while name in names:  # another run started in the same second
            name += "+"
        names.add(name)
        if number in numbered:
            runs[name] = numbered[number]
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
