"""`ledger compare RUN RUN [RUN…]`: runs side by side, latency as `vllm bench serve` defines it (docs/decide.md)."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.answers._aggregate import collect_runs
from usage_ledger.answers._compare_table import comparison_table
from usage_ledger.answers.audit import audit_run
from usage_ledger.answers.compare_latency import Sample, latency_ms, tpot_s
from usage_ledger.answers.comparison import COST_FIGURES, Comparison, Ratio, RunComparison, metric_values
from usage_ledger.answers.filters import calls_where
from usage_ledger.answers.reports import runs_report
from usage_ledger.ledger import (
    BlobNotFound,
    CallFinished,
    Database,
    call_stream,
    decode_chunk_gaps,
    read_blob,
    read_events,
)
from usage_ledger.projections import FORMULAS, ProjectionError, RunRow, live_version
from usage_ledger.projections.tables import calls

__all__ = ("Comparison", "Ratio", "RunComparison", "compare_runs", "metric_values", "render_comparison", "run_column")

_PAGE = 2000  # events per read while collecting chunk gaps


class _CallTimes(msgspec.Struct, frozen=True):
    call_id: str
    ok: bool
    gateway: bool
    started_at: datetime
    ended_at: datetime | None
    last_token_at: datetime | None
    ttft_s: float | None
    elapsed_s: float | None
    output_tokens: int
    last_position: int
    retags: int


async def _call_times(conn: AsyncConnection, version: int, run: str, run_gap_s: float) -> list[_CallTimes]:
    c = calls.c
    query = select(
        c.call_id,
        c.status,
        c.origin,
        c.started_at,
        c.ended_at,
        c.last_token_at,
        c.ttft_s,
        c.elapsed_s,
        c.output_tokens,
        c.last_position,
        c.retags,
    ).where(*await calls_where(conn, version, run, run_gap_s))
    return [
        _CallTimes(
            r[0], r[1] == "ok", r[2] == "gateway", r[3], r[4], r[5], r[6], r[7], int(r[8]), int(r[9]), int(r[10])
        )
        for r in await conn.execute(query)
    ]


async def _chunk_gaps(conn: AsyncConnection, wanted: Sequence[_CallTimes]) -> tuple[Counter[int], int]:
    """The chunk gaps (µs, counted per value) of the calls' `call.finished` events, and how many calls had any.

    Reads the positions from the first to the last of the calls' final events (a retagged call's
    `call.finished` lies before its last position: then from the start of the ledger), then each
    gap blob they name once (identical gaps are one blob); a blob missing or redacted: no gaps.
    """
    if not wanted:
        return Counter(), 0
    streams = {call_stream(t.call_id) for t in wanted}
    after = 0 if any(t.retags for t in wanted) else min(t.last_position for t in wanted) - 1
    last = max(t.last_position for t in wanted)
    named: Counter[str] = Counter()  # gap blob: calls that name it
    while after < last:
        page = await read_events(conn, after, _PAGE)
        if not page:
            break
        for stored in page:
            if stored.position > last:
                break
            if stored.type == "call.finished" and stored.stream in streams:
                body = stored.body()
                if isinstance(body, CallFinished) and body.chunk_gaps_blob:
                    named[body.chunk_gaps_blob] += 1
        after = page[-1].position
    gaps: Counter[int] = Counter()
    with_gaps = 0
    for digest, count in named.items():
        try:
            values = decode_chunk_gaps(await read_blob(conn, digest))
        except BlobNotFound:
            continue
        except msgspec.DecodeError as exc:
            raise ProjectionError(
                f"blob {digest} holds no chunk gaps ({exc}): check the ledger with `ledger verify`"
            ) from exc
        if values:
            gaps.update({value: n * count for value, n in Counter(values).items()})
            with_gaps += count
    return gaps, with_gaps


def _in_flight(times: Sequence[_CallTimes], wall_s: float | None) -> tuple[float | None, int | None]:
    spans = [(t.started_at, t.ended_at) for t in times if t.ended_at is not None]
    if not spans:
        return None, None
    busy = sum((end - start).total_seconds() for start, end in spans)
    mean = busy / wall_s if wall_s else None
    ends: list[datetime] = []
    peak = 0
    for start, end in sorted(spans):
        while ends and ends[0] <= start:
            heapq.heappop(ends)
        heapq.heappush(ends, end)
        peak = max(peak, len(ends))
    return mean, peak


def _latencies(times: Sequence[_CallTimes]) -> tuple[Sample, Sample, Sample]:
    """TTFT, TPOT and e2e samples (seconds) of the ok calls."""
    ttft: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    for t in times:
        if not t.ok:
            continue
        latency = (t.last_token_at - t.started_at).total_seconds() if t.last_token_at is not None else t.elapsed_s
        if latency is not None:
            e2e.append(latency)
        if t.ttft_s is None:
            continue
        ttft.append(t.ttft_s)
        if latency is not None and (per_token := tpot_s(latency, t.ttft_s, t.output_tokens)) is not None:
            tpot.append(per_token)
    return Sample.of(ttft), Sample.of(tpot), Sample.of(e2e)


_OWN = ("run", "throughput_tps")  # the name asked for; every formula's throughput, not the row's
_FROM_ROW = tuple(
    name for name in RunComparison.__struct_fields__ if name in RunRow.__struct_fields__ and name not in _OWN
)
"""The column's fields copied from the run's report row."""


async def run_column(database: Database, run: str, run_gap_s: float, *, refresh: bool) -> RunComparison:
    """One run's column (no audit): NotFound for a run the ledger does not have."""
    (row,) = await runs_report(database, run=run, run_gap_s=run_gap_s, refresh=refresh)  # NotFound if no such run
    async with database.engine.connect() as conn:
        version, _ = await live_version(conn, "calls")
        accs = await collect_runs(conn, version, run=run, run_gap_s=run_gap_s)
        times = await _call_times(conn, version, run, run_gap_s)
        ok_gateway = [t for t in times if t.ok and t.gateway]
        gaps, itl_calls = await _chunk_gaps(conn, ok_gateway)
    stats = accs[run].stats()
    mean, peak = _in_flight(times, row.wall_s)
    ttft, tpot, e2e = _latencies(times)
    return RunComparison(
        run=run,
        **{name: getattr(row, name) for name in _FROM_ROW},
        throughput_tps={name: FORMULAS[name](stats) for name in sorted(FORMULAS)},
        in_flight_mean=mean,
        in_flight_max=peak,
        ttft_ms=latency_ms(ttft, "s"),
        tpot_ms=latency_ms(tpot, "s"),
        itl_ms=latency_ms(Sample(gaps), "us"),
        e2e_ms=latency_ms(e2e, "s"),
        itl_calls=itl_calls,
        ok_calls=sum(t.ok for t in times),
    )


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def _currency(run: RunComparison) -> str | None:
    return run.cost.currency if run.cost is not None else None


def _ratios(column: RunComparison, first: RunComparison, base: dict[str, float | None]) -> dict[str, float | None]:
    """Every figure ÷ the first run's; costs only in one currency (never converted)."""
    values = {name: _ratio(value, base[name]) for name, value in metric_values(column).items()}
    if _currency(column) != _currency(first):
        values.update({f"cost.{name}": None for name in COST_FIGURES})
    return values


async def compare_runs(
    database: Database, runs: Sequence[str], *, run_gap_s: float = 900.0, refresh: bool = True
) -> Comparison:
    """Each run's column, the ratios of every run after the first against the first, and what audit finds.

    `refresh`: catch the projections up first (once); False under `ledger serve`, whose follower does."""
    if len(runs) < 2:
        raise ProjectionError("compare needs at least two runs")
    columns: list[RunComparison] = []
    for i, run in enumerate(runs):
        column = await run_column(database, run, run_gap_s, refresh=refresh and i == 0)
        audit = await audit_run(database, run, against=runs[0] if i else None, run_gap_s=run_gap_s, refresh=False)
        columns.append(
            msgspec.structs.replace(
                column,
                findings=[f"{f.kind}: {f.detail}" for f in audit.findings if f.kind != "differs_from_other_run"],
                differences=[f.detail for f in audit.findings if f.kind == "differs_from_other_run"],
            )
        )
    base = metric_values(columns[0])
    ratios = [
        Ratio(
            run=column.run,
            against=columns[0].run,
            values=_ratios(column, columns[0], base),
        )
        for column in columns[1:]
    ]
    return Comparison(runs=columns, ratios=ratios)


def render_comparison(comparison: Comparison, output_format: str, *, width: int = 100) -> str:
    """`json`: `{"runs": [...], "ratios": [...]}`; `table`: metrics as rows, runs (then ratios) as columns, its notes
    wrapped to `width` (the table is as wide as its runs need, past `width` only when they need more)."""
    if output_format == "json":
        return msgspec.json.encode(comparison).decode()
    if output_format == "table":
        return comparison_table(comparison, width=width)
    raise ProjectionError(f"unknown format {output_format!r}: use table or json")
