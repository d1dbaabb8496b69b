"""`ledger export` (calls as JSONL, CSV or Parquet) and `ledger show call|run`.

Export streams calls in start order; memory stays flat (Parquet is written in row groups).
Parquet needs `pyarrow` (optional: `pip install 'pyarrow>=15'`). `since_position` writes only the calls
changed after it, and every export says the position to continue from; both formats load into the
ClickHouse table of `clickhouse_sink`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import msgspec

from usage_ledger.answers.callviews import calls_page, get_call, iter_calls
from usage_ledger.answers.csv_cells import csv_cell
from usage_ledger.answers.export_columns import EXPORT_COLUMNS
from usage_ledger.answers.filters import NO_FILTER, CallFilter
from usage_ledger.answers.reports import runs_report, tickers_report
from usage_ledger.ledger import BlobNotFound, Database, call_stream, read_blob, read_stream
from usage_ledger.projections import (
    CallsPage,
    CallView,
    ProjectionError,
    RunRow,
    TickerRow,
    catch_up_all,
    live_version,
    read_checkpoint,
)

__all__ = ("Body", "CallDetail", "EventView", "Exported", "RunDetail", "export_calls", "show_call", "show_run")

EXPORT_FIELDS: tuple[str, ...] = CallView.__struct_fields__
_encoder = msgspec.json.Encoder()


class Body(msgspec.Struct, frozen=True, kw_only=True):
    blob: str
    text: str | None = None
    error: str | None = None
    """Why there is no text: redacted, or never stored (the ledger's own message)."""


class EventView(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    type: str
    occurred_at: datetime
    payload: msgspec.Raw


class CallDetail(msgspec.Struct, frozen=True, kw_only=True):
    call: CallView
    events: list[EventView]
    request: Body | None = None
    response: Body | None = None


class Exported(msgspec.Struct, frozen=True, kw_only=True):
    calls: int
    position: int
    """The calls read model's checkpoint when the export began: every change at or before it is in the export,
    so the next incremental export starts here (`--since-position`)."""


class RunDetail(msgspec.Struct, frozen=True, kw_only=True):
    run: RunRow
    tickers: list[TickerRow]
    calls: CallsPage | None = None
    """One page of the run's calls, in start order, with the total."""


def _csv_value(value: Any) -> Any:
    if isinstance(value, dict):
        return _encoder.encode(value).decode()
    return csv_cell(value)


async def _write_text(rows: AsyncIterator[CallView], out: IO[bytes], fmt: str) -> int:
    count = 0
    if fmt == "jsonl":
        async for view in rows:
            out.write(_encoder.encode(view) + b"\n")
            count += 1
        return count
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    writer = csv.writer(text)
    writer.writerow(EXPORT_FIELDS)
    async for view in rows:
        writer.writerow([_csv_value(getattr(view, f)) for f in EXPORT_FIELDS])
        count += 1
    text.flush()
    text.detach()
    return count


def _arrow_schema() -> Any:
    import pyarrow as pa  # type: ignore[import-untyped]

    kinds = {
        "text": pa.string(),
        "integer": pa.int64(),
        "real": pa.float64(),
        "time": pa.timestamp("us", tz="UTC"),
        "tags": pa.map_(pa.string(), pa.string()),
    }
    return pa.schema([pa.field(c.name, kinds[c.kind], nullable=c.nullable) for c in EXPORT_COLUMNS])


async def _write_parquet(rows: AsyncIterator[CallView], path: Path) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError as exc:
        raise ProjectionError("parquet export needs pyarrow: pip install 'pyarrow>=15'") from exc
    schema = _arrow_schema()
    count = 0
    batch: list[CallView] = []

    def flush(writer: Any) -> None:
        columns = {f: [getattr(v, f) for v in batch] for f in EXPORT_FIELDS}
        columns["tags"] = [list(t.items()) for t in columns["tags"]]
        writer.write_table(pa.Table.from_pydict(columns, schema=schema))
        batch.clear()

    with pq.ParquetWriter(str(path), schema) as writer:
        async for view in rows:
            batch.append(view)
            count += 1
            if len(batch) >= 50_000:
                flush(writer)
        if batch or count == 0:
            flush(writer)
    return count


async def export_calls(
    database: Database,
    *,
    fmt: str = "jsonl",
    run: str | None = None,
    output: str | Path | None = None,
    stdout: IO[bytes] | None = None,
    run_gap_s: float = 900.0,
    filters: CallFilter = NO_FILTER,
    since_position: int | None = None,
) -> Exported:
    """Write every call (or the calls of `run`), of those matching `filters` and changed after `since_position`,
    to `output` (or `stdout`)."""
    if fmt not in ("jsonl", "csv", "parquet"):
        raise ProjectionError(f"unknown export format {fmt!r}: use jsonl, csv or parquet")
    if fmt == "parquet" and output is None:
        raise ProjectionError("parquet export needs --output FILE")
    await catch_up_all(database)
    # read before the rows: rows and checkpoint commit together, so the rows read next hold every change up to it
    async with database.engine.connect() as conn:
        position = await read_checkpoint(conn, "calls", (await live_version(conn, "calls"))[0])
    rows = iter_calls(
        database, run=run, run_gap_s=run_gap_s, refresh=False, filters=filters, since_position=since_position
    )
    if fmt == "parquet":
        assert output is not None
        count = await _write_parquet(rows, Path(output))
    elif output is not None:
        with Path(output).open("wb") as handle:  # noqa: ASYNC230 - rows stream from the database into it
            count = await _write_text(rows, handle, fmt)
    else:
        assert stdout is not None
        count = await _write_text(rows, stdout, fmt)
    return Exported(calls=count, position=position)


async def _body(conn: Any, digest: str | None) -> Body | None:
    if digest is None:
        return None
    try:
        data = await read_blob(conn, digest)
    except BlobNotFound as exc:
        return Body(blob=digest, error=str(exc))
    return Body(blob=digest, text=data.decode("utf-8", errors="replace"))


async def show_call(database: Database, call_id: str, *, bodies: bool = True, refresh: bool = True) -> CallDetail:
    """A call's row, its events and (decompressed) request and response bodies: `ledger show call` and the
    dashboard's call page (`refresh=False` where `ledger serve` keeps the projections current)."""
    view = await get_call(database, call_id, refresh=refresh)
    async with database.engine.connect() as conn:
        history = [
            EventView(
                position=e.position, type=e.type, occurred_at=e.occurred_at, payload=msgspec.Raw(e.payload.encode())
            )
            for e in await read_stream(conn, call_stream(call_id))
        ]
        request = await _body(conn, view.request_blob) if bodies else None
        response = await _body(conn, view.response_blob) if bodies else None
    return CallDetail(call=view, events=history, request=request, response=response)


async def show_run(
    database: Database,
    run: str,
    *,
    formula: str | None = None,
    run_gap_s: float = 900.0,
    offset: int = 0,
    limit: int = 20,
) -> RunDetail:
    """A run's report row, its tickers and a page of its calls (`offset`, `limit`)."""
    rows = await runs_report(database, formula=formula, run=run, run_gap_s=run_gap_s)
    tickers = await tickers_report(database, run=run, run_gap_s=run_gap_s, refresh=False)
    page = await calls_page(database, run=run, offset=offset, limit=limit, run_gap_s=run_gap_s, refresh=False)
    return RunDetail(run=rows[0], tickers=tickers, calls=page)
