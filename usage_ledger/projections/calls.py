"""The calls read model: one row per call, folded from gateway events or imports.

The fold is a pure function of the call's events in position order:

- `call.started` / `call.imported` begin a fresh row (whatever came before for that id);
- `call.finished` / `call.failed` complete it (or create it from `timings.received` if the start
  never arrived);
- `call.retagged` changes run and tags of an existing row (history is never touched).

A page of events is folded in memory; only calls whose first event in the page continues an
earlier row are loaded from the database. Every touched row is then written whole (upsert), so a
rebuild in one pass and incremental application in any split produce identical rows.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.events import CallImported, CallRetagged
from usage_ledger.ledger.schema import UTCDateTime, events, sqlite_bind
from usage_ledger.ledger.sqlite_append import SqliteWrite
from usage_ledger.projections._bulk import drop_work_tables, insert_plain_calls, prepare_calls, remaining_positions
from usage_ledger.projections._digest_lines import encode_page
from usage_ledger.projections._slim import SFailed, SFinished, SStarted, decode_slim
from usage_ledger.projections._sqlite_digest import CHILD_FROM, split_digest
from usage_ledger.projections.call_rules import decode_tps, ended_at, finished_status, prefill_tps
from usage_ledger.projections.tables import calls
from usage_ledger.projections.text import projection_tags, projection_text, projection_text_or_none

__all__ = ("CALL_COLUMNS", "CallsProjection", "fold_call", "rows_digest")

Row = dict[str, Any]
CALL_COLUMNS: tuple[str, ...] = tuple(c.name for c in calls.columns)
_FRESH = frozenset({"call.started", "call.imported"})
_HANDLED = frozenset({"call.started", "call.finished", "call.failed", "call.imported", "call.retagged"})
_tags_encoder = msgspec.json.Encoder(order="sorted")
_tags_decoder = msgspec.json.Decoder(dict[str, str])
_digest_encoder = msgspec.json.Encoder(order="sorted")

_SECURE_DELETE = ("OFF", "ON", "FAST")  # PRAGMA secure_delete's values, by what it reads back
_SQLITE_UPSERT = (
    f"INSERT INTO {calls.name} ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' * len(CALL_COLUMNS))}) "
    f"ON CONFLICT (version, call_id) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in CALL_COLUMNS if name not in ("version", "call_id"))
)


_DIGEST_PAGE = 20_000
_DIGEST_COLUMNS = [c for c in calls.columns if c.name != "version"]
_TIME_INDEXES = tuple(i for i, c in enumerate(_DIGEST_COLUMNS) if isinstance(c.type, UTCDateTime))


def _rfc3339_sql(name: str) -> str:
    """SQL: a stored SQLite datetime (`YYYY-MM-DD HH:MM:SS.ffffff`, naive UTC) as msgspec encodes it (RFC 3339).

    In that shape the only `.000000` is the fraction; any other stored text is marked with `ODD`.
    """
    return (
        f"CASE WHEN {name} GLOB '????-??-?? ??:??:??.??????' "
        f"THEN replace(replace({name}, ' ', 'T'), '.000000', '') || 'Z' ELSE char(0) || {name} END"
    )


# `{op}`: a bound on call_id for a half of the rows (`_sqlite_digest`); `1` for all of them
_SQLITE_DIGEST_RANGE = (
    "SELECT "
    + ", ".join(_rfc3339_sql(c.name) if i in _TIME_INDEXES else c.name for i, c in enumerate(_DIGEST_COLUMNS))
    + f" FROM {calls.name} WHERE version = ? AND call_id {{op}} ? ORDER BY call_id"
)
_SQLITE_DIGEST = _SQLITE_DIGEST_RANGE.replace("call_id {op} ?", "1")


def _sqlite_params(rows: list[Row]) -> list[tuple[Any, ...]]:
    return [tuple(sqlite_bind(row[name]) for name in CALL_COLUMNS) for row in rows]


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def _derive(row: Row) -> Row:
    started: datetime = row["started_at"]
    row["elapsed_s"] = _seconds(row["ended_at"], started)
    first, last = row["first_token_at"], row["last_token_at"]
    if row["origin"] == "gateway":
        row["ttft_s"] = _seconds(first, started)
    row["prefill_tps"] = prefill_tps(row["input_tokens"], row["ttft_s"])
    row["decode_tps"] = decode_tps(row["output_tokens"], _seconds(last, first))
    return row


def _blank(version: int, call_id: str, started_at: datetime) -> Row:
    return {
        "version": version,
        "call_id": call_id,
        "run": None,
        "ticker": None,
        "tags": "{}",
        "model": None,
        "origin": "gateway",
        "source": None,
        "status": "incomplete",
        "http_status": None,
        "failure_reason": None,
        "usage_source": "absent",
        "started_at": started_at,
        "first_token_at": None,
        "last_token_at": None,
        "ended_at": None,
        "elapsed_s": None,
        "ttft_s": None,
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_tokens": None,
        "prefill_tps": None,
        "decode_tps": None,
        "request_blob": None,
        "response_blob": None,
        "retags": 0,
        "last_position": 0,
    }


def _finish(row: Row, ev: SFinished | SFailed) -> None:
    t = ev.timings
    row["ended_at"] = ended_at(t.finished, t.last_token, t.upstream_headers, t.received)
    row["first_token_at"] = t.first_token
    row["last_token_at"] = t.last_token
    row["response_blob"] = ev.response_blob
    row["usage_source"] = ev.usage_source
    if ev.usage is not None:
        row["input_tokens"] = ev.usage.prompt_tokens
        row["output_tokens"] = ev.usage.completion_tokens
        row["cached_tokens"] = ev.usage.cached_tokens
    if isinstance(ev, SFinished):
        row["http_status"] = ev.status
        row["status"] = finished_status(ev.status)
        row["failure_reason"] = None
    else:
        row["http_status"] = ev.client_status
        row["status"] = "failed"
        row["failure_reason"] = ev.reason


def fold_call(row: Row | None, ev: Any, version: int, position: int) -> Row | None:
    """Apply one slim call event to a call's row (None = no row yet); returns the new row."""
    # client text through the one rule of `projections.text` (U+0000 → U+FFFD); call ids as they are
    if isinstance(ev, SStarted):
        row = _blank(version, ev.call_id, ev.received_at)
        tags = projection_tags(ev.tags)
        row["run"] = projection_text_or_none(ev.run)
        row["tags"] = _tags_encoder.encode(tags).decode()
        row["ticker"] = tags.get("ticker")
        row["model"] = projection_text_or_none(ev.model)
        row["request_blob"] = ev.request_blob
    elif isinstance(ev, CallImported):
        row = _blank(version, ev.call_id, ev.started_at)
        tags = projection_tags(ev.tags)
        row.update(
            run=projection_text_or_none(ev.run),
            tags=_tags_encoder.encode(tags).decode(),
            ticker=tags.get("ticker"),
            model=projection_text_or_none(ev.model),
            origin="import",
            source=projection_text(f"{ev.source}:{ev.line}"),
            status=ev.status,
            usage_source="imported",
            ended_at=ev.finished_at,
            ttft_s=ev.ttft_s,
            input_tokens=ev.input_tokens,
            output_tokens=ev.output_tokens,
        )
        if ev.ttft_s is not None:
            row["first_token_at"] = ev.started_at + timedelta(seconds=ev.ttft_s)
    elif isinstance(ev, SFinished | SFailed):
        if row is None:
            row = _blank(version, ev.call_id, ev.timings.received)
        _finish(row, ev)
    elif isinstance(ev, CallRetagged):
        if row is None:
            return None
        if ev.run is not None:
            row["run"] = projection_text(ev.run)
        tags = _tags_decoder.decode(row["tags"])
        tags.update(projection_tags(ev.tags))
        for name in map(projection_text, ev.removed_tags):
            tags.pop(name, None)
        row["tags"] = _tags_encoder.encode(tags).decode()
        row["ticker"] = tags.get("ticker")
        row["retags"] += 1
    else:  # pragma: no cover - filtered by the caller
        return row
    row["last_position"] = position
    return _derive(row)


class CallsProjection:
    """Calls: one row per call id and version."""

    name = "calls"
    handles = _HANDLED

    async def apply(self, conn: AsyncConnection, version: int, page: Sequence[tuple[int, str, str]]) -> None:
        await self.write(conn, await self.fold(conn, version, page))

    async def fold(self, conn: AsyncConnection, version: int, page: Sequence[tuple[int, str, str]]) -> list[Row]:
        """The rows the page's events change, folded onto their stored state (reads, never writes)."""
        by_call: dict[str, list[tuple[int, Any]]] = {}
        for position, type_, payload in page:
            if type_ not in _HANDLED:
                continue
            ev = decode_slim(type_, payload)
            by_call.setdefault(ev.call_id, []).append((position, ev))
        if not by_call:
            return []
        continuing = [cid for cid, evs in by_call.items() if evs[0][1].__struct_config__.tag not in _FRESH]
        existing = await self._load(conn, version, continuing)
        rows: list[Row] = []
        for call_id, evs in by_call.items():
            row = existing.get(call_id)
            for position, ev in evs:
                row = fold_call(row, ev, version, position)
            if row is not None:
                rows.append(row)
        return rows

    async def prepare(
        self, conn: AsyncConnection, head: int, workdir: Path, progress: Callable[[int, int], None] | None = None
    ) -> None:
        await prepare_calls(conn, head, workdir, progress)

    async def load(self, conn: AsyncConnection, version: int, head: int) -> None:
        """Fill an empty `version` with every call event up to `head`: plain calls in SQL, the rest folded here."""
        await insert_plain_calls(conn, version)
        async for positions in remaining_positions(conn):
            page: list[tuple[int, str, str]] = []
            for start in range(0, len(positions), 5000):
                result = await conn.execute(
                    select(events.c.position, events.c.type, events.c.payload).where(
                        events.c.position.in_(positions[start : start + 5000])
                    )
                )
                page.extend((r[0], r[1], r[2]) for r in result)
            page.sort()
            await self.apply(conn, version, page)
        if conn.dialect.name == "postgresql":  # on SQLite `load_version` discards the connection and the files
            await drop_work_tables(conn)

    async def _load(self, conn: AsyncConnection, version: int, call_ids: list[str]) -> dict[str, Row]:
        found: dict[str, Row] = {}
        for start in range(0, len(call_ids), 500):
            chunk = call_ids[start : start + 500]
            result = await conn.execute(select(calls).where(calls.c.version == version, calls.c.call_id.in_(chunk)))
            for r in result.mappings():
                found[r["call_id"]] = dict(r)
        return found

    async def write(self, conn: AsyncConnection, rows: list[Row]) -> None:
        """Insert or replace the folded rows."""
        if not rows:
            return
        if conn.dialect.name == "sqlite":
            # Fast path: one executemany of plain tuples (datetimes in SQLAlchemy's SQLite storage
            # format), skipping per-row parameter processing; several times faster on big rebuilds.
            await conn.exec_driver_sql(_SQLITE_UPSERT, _sqlite_params(rows))
            return
        dialect = postgresql
        statement = dialect.insert(calls)
        statement = statement.on_conflict_do_update(
            index_elements=[calls.c.version, calls.c.call_id],
            set_={name: statement.excluded[name] for name in CALL_COLUMNS if name not in ("version", "call_id")},
        )
        for start in range(0, len(rows), 5000):
            await conn.execute(statement, rows[start : start + 5000])

    def sqlite_write(self, rows: list[Row]) -> SqliteWrite:
        """`write` as plain `sqlite3` statements for the caller's transaction; rows converted now."""
        params = _sqlite_params(rows)
        return lambda conn: conn.executemany(_SQLITE_UPSERT, params) if params else None

    async def digest(self, conn: AsyncConnection, version: int) -> str:
        """SHA-256 over every row of `version` in call-id order (streamed: memory stays flat).

        Each row is the msgspec JSON of its column values (datetimes as RFC 3339 UTC), one per line.
        On SQLite the stored datetime text is rewritten to that form in SQL and the rows are read
        as plain tuples from the driver and encoded a page at a time, which is what decoding each
        value to a `datetime` and encoding that would give, without the per-value round trip; a
        big version's upper half is encoded by a child process (`_sqlite_digest`), reading the
        committed rows.
        """
        if conn.dialect.name == "sqlite":
            return await _sqlite_digest(conn, version)
        return await rows_digest(conn, version)

    async def drop(self, conn: AsyncConnection, version: int) -> None:
        if conn.dialect.name != "sqlite":
            await conn.execute(delete(calls).where(calls.c.version == version))
            return
        # Debian's SQLite is built with SECURE_DELETE on: every deleted row zeroed, every page of
        # the version written to the WAL and checkpointed back. FAST zeroes what the delete
        # rewrites anyway and no more (1M rows, by hand: 360 -> 211 MB of WAL). Rows of a read model hold
        # nothing the ledger does not keep; restored afterwards, the connection goes back to a pool.
        previous = (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar_one()
        await conn.exec_driver_sql("PRAGMA secure_delete = FAST")
        try:
            await conn.execute(delete(calls).where(calls.c.version == version))
        finally:
            await conn.exec_driver_sql(f"PRAGMA secure_delete = {_SECURE_DELETE[int(previous)]}")


async def _sqlite_digest(conn: AsyncConnection, version: int, child_from: int = CHILD_FROM) -> str:
    ledger = conn.engine.url.database
    assert ledger is not None
    split = await asyncio.to_thread(
        split_digest, ledger, _SQLITE_DIGEST_RANGE, version, _TIME_INDEXES, child_from=child_from
    )
    if split is not None:
        return split
    digest = hashlib.sha256()
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    cursor = await driver.execute(_SQLITE_DIGEST, (version,))
    try:
        while rows := await cursor.fetchmany(_DIGEST_PAGE):
            digest.update(encode_page(rows, _TIME_INDEXES))
    finally:
        await cursor.close()
    return digest.hexdigest()


async def rows_digest(conn: AsyncConnection, version: int) -> str:
    """The digest of `CallsProjection.digest` from SQLAlchemy rows (values as the column types return them)."""
    digest = hashlib.sha256()
    after = ""
    while True:
        result = await conn.execute(
            select(*_DIGEST_COLUMNS)
            .where(calls.c.version == version, calls.c.call_id > after)
            .order_by(calls.c.call_id)
            .limit(_DIGEST_PAGE)
        )
        rows = result.all()
        digest.update(_digest_encoder.encode_lines([tuple(r) for r in rows]))
        if len(rows) < _DIGEST_PAGE:
            return digest.hexdigest()
        after = rows[-1][0]
