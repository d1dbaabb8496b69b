"""The calls read model: one row per call, folded from gateway events or imports (`call_fold`).

A page of events is folded in memory; only calls whose first event in the page continues an
earlier row are loaded from the database. Every touched row is then written whole (upsert), so a
rebuild in one pass and incremental application in any split produce identical rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import backend_of, call_stream
from usage_ledger.projections.call_fold import HANDLED, CallRow, decode_calls, fold_calls
from usage_ledger.projections.tables import calls

__all__ = ("CallsProjection", "rows_digest")


class _CallKey(msgspec.Struct):
    call_id: str


_key_decoder = msgspec.json.Decoder(_CallKey)
_digest_encoder = msgspec.json.Encoder(order="sorted")

_DIGEST_PAGE = 20_000
_DIGEST_COLUMNS = [c for c in calls.columns if c.name != "version"]


class CallsProjection:
    """Calls: one row per call id and version (`call_fold.CallRow`)."""

    name = "calls"
    handles = HANDLED
    table = calls

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

        Each row is the msgspec JSON of its column values (datetimes as RFC 3339 UTC), one per line,
        read through the driver by the backend (`Backend.digest`); `rows_digest` is its reference form.
        """
        return await backend_of(conn).digest(conn, calls, version, self.name)


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
