"""The calls read model: one row per call, folded from gateway events or imports (`call_fold`).

A page of events is folded in memory; only calls whose first event in the page continues an
earlier row are loaded from the database. Every touched row is then written whole (upsert), so a
rebuild in one pass and incremental application in any split produce identical rows.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import call_stream
from usage_ledger.ledger.schema import UTCDateTime
from usage_ledger.projections._digest_lines import encode_page
from usage_ledger.projections._sqlite_digest import CHILD_FROM, split_digest
from usage_ledger.projections.call_fold import HANDLED, CallRow, decode_calls, fold_calls
from usage_ledger.projections.row_table import RowTable
from usage_ledger.projections.tables import calls

__all__ = ("CallsProjection", "rows_digest")


class _CallKey(msgspec.Struct):
    call_id: str


_key_decoder = msgspec.json.Decoder(_CallKey)
_digest_encoder = msgspec.json.Encoder(order="sorted")

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


class CallsProjection:
    """Calls: one row per call id and version (`call_fold.CallRow`)."""

    name = "calls"
    handles = HANDLED
    table = RowTable(calls)

    @staticmethod
    def partition_key(payload: str) -> str:
        """A call event's stream, `call-<call id>` (every event of the calls model names a call; a row reads
        only its call's events)."""
        return call_stream(_key_decoder.decode(payload).call_id)

    async def fold(
        self, conn: AsyncConnection, version: int, page: Sequence[tuple[int, str, str]], unwritten: Sequence[Any] = ()
    ) -> list[CallRow]:
        """The rows the page's events change, folded onto their stored state (reads, never writes)."""
        events, continuing = decode_calls(page)
        existing: dict[str, CallRow] = {}
        if continuing:
            recent = {row.call_id: row for row in unwritten}
            # a copy: the unwritten row may still be on its way to the table
            existing = {cid: msgspec.structs.replace(recent[cid]) for cid in continuing if cid in recent}
            existing.update(await self._stored(conn, version, [cid for cid in continuing if cid not in recent]))
        return fold_calls(events, existing, version)

    async def _stored(self, conn: AsyncConnection, version: int, call_ids: list[str]) -> dict[str, CallRow]:
        found: dict[str, CallRow] = {}
        for start in range(0, len(call_ids), 500):
            chunk = call_ids[start : start + 500]
            result = await conn.execute(select(calls).where(calls.c.version == version, calls.c.call_id.in_(chunk)))
            for r in result.mappings():
                found[r["call_id"]] = CallRow(**r)
        return found

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
        return await _pg_digest(conn, version)


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


_PG_DIGEST = (
    f"SELECT {', '.join(c.name for c in _DIGEST_COLUMNS)} FROM {calls.name} "
    "WHERE version = $1 AND call_id > $2 ORDER BY call_id LIMIT $3"
)


async def _pg_digest(conn: AsyncConnection, version: int) -> str:
    """`rows_digest` through asyncpg: the same values (timestamps in UTC, as `UTCDateTime` returns them)."""
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    digest = hashlib.sha256()
    after = ""
    while True:
        rows = await driver.fetch(_PG_DIGEST, version, after, _DIGEST_PAGE)
        digest.update(_digest_encoder.encode_lines([tuple(r) for r in rows]))
        if len(rows) < _DIGEST_PAGE:
            return digest.hexdigest()
        after = rows[-1][0]
