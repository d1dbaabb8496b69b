"""Erasing many bodies: a batch's `blob.redacted` events are appended first, then its bytes are erased.

Each batch is two short transactions (the ledger's one append path, then an UPDATE the blob triggers allow); a
run cut between them is finished by running it again (docs/operations.md, "Retention of bodies"). Who selects
the hashes (a run, an age) is the caller's business: the ledger knows bodies, not calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from sqlalchemy import select

from usage_ledger.ledger.append import append_events, as_ledger_errors
from usage_ledger.ledger.blobs import blob_erasures, blob_stream, erase_contents
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import BlobRedacted, new_event
from usage_ledger.ledger.schema import blobs

__all__ = ("ERASE_BATCH", "ErasedBatch", "erase_bodies", "reclaim_space")

ERASE_BATCH = 500
"""Bodies per batch: 500 events are one short append, so a gateway's appends wait milliseconds, not seconds."""


class ErasedBatch(msgspec.Struct, frozen=True, kw_only=True):
    erased: int
    """Bodies whose bytes this call erased."""
    stored_bytes: int
    """What they took in the blob store (compressed)."""
    resumed: int
    """Of those, bodies whose `blob.redacted` an interrupted erase had already appended."""
    already: int
    """Bodies that were erased before (nothing done)."""


async def erase_bodies(database: Database, digests: Sequence[str], reason: str) -> ErasedBatch:
    """Erase the stored bodies `digests` (at most `ERASE_BATCH` is one short lock), recording why first."""
    if not reason.strip():
        raise ValueError("an erasure needs a reason")
    wanted = sorted(set(digests))
    with as_ledger_errors(database):
        async with database.engine.connect() as conn:
            rows = await conn.execute(
                select(blobs.c.hash, blobs.c.stored_size).where(blobs.c.hash.in_(wanted), blobs.c.redacted_at.is_(None))
            )
            present = {digest: int(size) for digest, size in rows}
            recorded = await blob_erasures(conn, present)
    missing = [digest for digest in sorted(present) if digest not in recorded]
    if missing:
        batch = [new_event(BlobRedacted(blob_hash=d, reason=reason), stream=blob_stream(d)) for d in missing]
        await append_events(database, batch)
    erased: list[str] = []
    if present:
        with as_ledger_errors(database):
            conn = await database.writer()
            try:
                async with conn.begin():
                    result = await conn.execute(erase_contents(sorted(present)).returning(blobs.c.hash))
                    erased = list(result.scalars())
            finally:
                await conn.close()
    return ErasedBatch(
        erased=len(erased),
        stored_bytes=sum(present[digest] for digest in erased),
        resumed=len(present) - len(missing),
        already=len(set(wanted)) - len(present),
    )


async def reclaim_space(database: Database) -> None:
    """Give erased bodies' space back: SQLite rewrites the file (`VACUUM`: every other writer waits, and it
    needs free disk of the database's size); PostgreSQL's `VACUUM` makes the blob table's space reusable
    (returning it to the operating system takes `VACUUM FULL`, which locks the table: docs/operations.md)."""
    with as_ledger_errors(database):
        await database.backend_ops.reclaim_blob_space(database.engine)
