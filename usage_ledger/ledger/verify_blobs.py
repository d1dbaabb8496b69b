"""Verifying `ledger_blobs` against the verified chain, in bounded memory.

Every blob row must hash (decompressed as the store wrote it) to its name and have the size it
claims; every blob a verified event references (request and response bodies, chunk gaps) must be
stored unless a verified `blob.redacted` names it; an erased body needs that event, recorded
before the erasure. A row no verified event references is counted (`unreferenced`), not a problem: named by
its own hash it can change nothing an event says, and PostgreSQL's appender commits a batch's bodies before
its events, so an append that never committed leaves one (events cut from the tail are the signed
checkpoints' to catch). References and redactions seen on the chain walk go to a scratch SQLite file (a
ledger may reference millions of bodies), then both sides are merged in hash order.
"""

from __future__ import annotations

import hashlib
import sqlite3
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import msgspec
import zstandard
from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.chain import epoch_micros
from usage_ledger.ledger.db import backend_of
from usage_ledger.ledger.events import BlobRedacted, CallFailed, CallFinished, CallStarted, Event
from usage_ledger.ledger.schema import blobs

__all__ = ("BlobProblem", "BlobReferences", "BlobReport", "audit_blobs")

MAX_PROBLEMS = 100  # listed in the report; all are counted
_FLUSH_ROWS = 5_000
_SCRATCH_CACHE_KIB = 8 * 1024
_READ_CHUNK = 1 << 20
_FETCH_ROWS = 500
_decompressor = zstandard.ZstdDecompressor()


class BlobProblem(msgspec.Struct, frozen=True, kw_only=True):
    hash: str
    problem: str
    position: int | None = None
    """The first verified event that references the blob (or redacts it)."""


class BlobReport(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    checked: int
    referenced: int
    problems_total: int = 0
    problems: list[BlobProblem] = []
    unreferenced: int = 0
    """Stored bodies no verified event references (see the module's docstring): reported, not a problem."""


class _Reference(NamedTuple):
    hash: str
    position: int
    redacted_position: int | None
    redacted_recorded_us: int | None


class _BlobRow(NamedTuple):
    hash: str
    size: int
    codec: str
    stored_size: int
    length: int | None
    erased: bool
    redacted_at: datetime | None
    inline: bytes | None


class BlobReferences:
    """A chain observer that remembers which blobs verified events reference and redact."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ledger-verify-")
        self._db = sqlite3.connect(Path(self._dir.name) / "references.db")
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA temp_store=FILE")
        self._db.execute(f"PRAGMA cache_size=-{_SCRATCH_CACHE_KIB}")
        # plain appends (a hash-keyed index would take random inserts); one sort at the end
        self._db.execute("CREATE TABLE refs (hash TEXT NOT NULL, position INTEGER NOT NULL)")
        self._db.execute("CREATE TABLE redactions (hash TEXT NOT NULL, position INTEGER NOT NULL, recorded_us INTEGER)")
        self._refs: list[tuple[str, int]] = []
        self._redactions: list[tuple[str, int, int]] = []

    def row(self, position: int, event_id: uuid.UUID, stored_hash: str, recorded_at: datetime, body: Event) -> None:
        if isinstance(body, CallStarted):
            self._reference(body.request_blob, position)
        elif isinstance(body, CallFinished | CallFailed):
            self._reference(body.response_blob, position)
            self._reference(body.chunk_gaps_blob, position)
        elif isinstance(body, BlobRedacted):
            self._redactions.append((body.blob_hash, position, epoch_micros(recorded_at)))

    def _reference(self, digest: str | None, position: int) -> None:
        if digest is not None:
            self._refs.append((digest, position))
            if len(self._refs) >= _FLUSH_ROWS:
                self._flush()

    def _flush(self) -> None:
        with self._db:  # one transaction per flush (autocommit would commit row by row)
            self._db.executemany("INSERT INTO refs VALUES (?, ?)", self._refs)
            self._db.executemany("INSERT INTO redactions VALUES (?, ?, ?)", self._redactions)
        self._refs.clear()
        self._redactions.clear()

    def references(self) -> Iterator[_Reference]:
        """Each referenced hash once, in byte order, with its first reference and first redaction."""
        self._flush()
        cursor = self._db.execute(
            "SELECT r.hash, r.position, d.position, d.recorded_us"
            " FROM (SELECT hash, min(position) AS position FROM refs GROUP BY hash) r"
            " LEFT JOIN (SELECT hash, min(position) AS position, recorded_us FROM redactions GROUP BY hash) d"
            " ON d.hash = r.hash ORDER BY r.hash"
        )
        for row in cursor:
            yield _Reference(*row)

    def count(self) -> int:
        self._flush()
        return int(self._db.execute("SELECT count(DISTINCT hash) FROM refs").fetchone()[0])

    def close(self) -> None:
        self._db.close()
        self._dir.cleanup()


async def audit_blobs(
    conn: AsyncConnection,
    references: BlobReferences,
    clock_skew: timedelta,
    *,
    page_size: int = 1_000,
    fetch_bytes: int = 16 << 20,
    inline_bytes: int = 16 << 10,
) -> BlobReport:
    """Merge the stored blobs with the references of the verified chain (both in hash order)."""
    audit = _Audit(conn, clock_skew, fetch_bytes)
    pending = references.references()
    ref = next(pending, None)
    async for blob in _blob_rows(conn, page_size, inline_bytes):
        while ref is not None and ref.hash < blob.hash:
            audit.missing(ref)
            ref = next(pending, None)
        if ref is not None and ref.hash == blob.hash:
            await audit.check(blob, ref)
            ref = next(pending, None)
        else:
            audit.unreferenced += 1
        audit.checked += 1
    while ref is not None:
        audit.missing(ref)
        ref = next(pending, None)
    await audit.check_contents()
    return BlobReport(
        ok=audit.total == 0,
        checked=audit.checked,
        referenced=references.count(),
        problems_total=audit.total,
        problems=audit.problems,
        unreferenced=audit.unreferenced,
    )


async def _blob_rows(conn: AsyncConnection, page_size: int, inline_bytes: int) -> AsyncIterator[_BlobRow]:
    key = backend_of(conn).byte_order(blobs.c.hash)  # byte order, as the scratch file sorts
    columns = (
        blobs.c.hash,
        blobs.c.size,
        blobs.c.codec,
        blobs.c.stored_size,
        func.length(blobs.c.content),
        blobs.c.content.is_(None),
        blobs.c.redacted_at,
        # small bodies come with their page; larger ones are fetched a few at a time
        case((func.length(blobs.c.content) <= inline_bytes, blobs.c.content), else_=None),
    )
    after: str | None = None
    while True:
        query = select(*columns).order_by(key).limit(page_size)
        if after is not None:
            query = query.where(key > after)
        rows = (await conn.execute(query)).all()
        for row in rows:
            inline = bytes(row[7]) if row[7] is not None else None
            yield _BlobRow(row[0], int(row[1]), row[2], int(row[3]), row[4], bool(row[5]), row[6], inline)
        if len(rows) < page_size:
            return
        after = rows[-1][0]


class _Audit:
    def __init__(self, conn: AsyncConnection, clock_skew: timedelta, fetch_bytes: int) -> None:
        self.conn = conn
        self.skew_us = clock_skew // timedelta(microseconds=1)
        self.fetch_bytes = fetch_bytes
        self.checked = 0
        self.total = 0
        self.unreferenced = 0
        self.problems: list[BlobProblem] = []
        self._queued: list[_BlobRow] = []
        self._queued_bytes = 0
        self._positions: dict[str, int] = {}

    def add(self, digest: str, problem: str, position: int | None = None) -> None:
        self.total += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(BlobProblem(hash=digest, problem=problem, position=position))

    def missing(self, ref: _Reference) -> None:
        if ref.redacted_position is None:  # a redaction recorded for a body never stored (`redact --force`) is fine
            self.add(ref.hash, "referenced by a verified event but not stored (the row was deleted)", ref.position)

    async def check(self, blob: _BlobRow, ref: _Reference) -> None:
        if blob.erased:
            self._check_erased(blob, ref)
            return
        if blob.redacted_at is not None:
            self.add(blob.hash, "redacted_at is set but the content is present", ref.position)
        if blob.stored_size != blob.length:
            self.add(
                blob.hash, f"stored_size says {blob.stored_size}, the content is {blob.length} bytes", ref.position
            )
        elif blob.codec not in ("raw", "zstd"):
            self.add(blob.hash, f"unknown codec {blob.codec!r}", ref.position)
        elif blob.inline is not None:
            problem = _content_problem(blob, blob.inline)
            if problem is not None:
                self.add(blob.hash, problem, ref.position)
        else:
            self._queued.append(blob)
            self._positions[blob.hash] = ref.position
            self._queued_bytes += blob.stored_size
            if self._queued_bytes >= self.fetch_bytes or len(self._queued) >= _FETCH_ROWS:
                await self.check_contents()

    def _check_erased(self, blob: _BlobRow, ref: _Reference) -> None:
        if ref.redacted_position is None or ref.redacted_recorded_us is None:
            self.add(blob.hash, "the content was erased without a verified blob.redacted event", ref.position)
        elif blob.redacted_at is None:
            self.add(blob.hash, "the content is erased but redacted_at is empty", ref.redacted_position)
        elif epoch_micros(blob.redacted_at) < ref.redacted_recorded_us - self.skew_us:
            self.add(
                blob.hash,
                f"erased at {blob.redacted_at.isoformat()}, before its blob.redacted event was recorded",
                ref.redacted_position,
            )
        elif blob.stored_size != 0:
            self.add(blob.hash, f"erased, yet stored_size says {blob.stored_size}", ref.redacted_position)

    async def check_contents(self) -> None:
        """Fetch the queued blobs' bytes (about `fetch_bytes` at a time) and hash them."""
        queued, self._queued, self._queued_bytes = self._queued, [], 0
        if not queued:
            return
        by_hash = {blob.hash: blob for blob in queued}
        rows = await self.conn.execute(select(blobs.c.hash, blobs.c.content).where(blobs.c.hash.in_(list(by_hash))))
        for digest, content in rows:
            blob = by_hash[digest]
            problem = _content_problem(blob, bytes(content))
            if problem is not None:
                self.add(digest, problem, self._positions.get(digest))
        self._positions.clear()


def _content_problem(blob: _BlobRow, content: bytes) -> str | None:
    digest = hashlib.sha256()
    size = 0
    if blob.codec == "raw":
        digest.update(content)
        size = len(content)
    else:
        try:
            if zstandard.frame_content_size(content) == blob.size:
                # the frame says the size the row claims: one call (zstd checks the frame holds that much)
                data = _decompressor.decompress(content)
                digest.update(data)
                size = len(data)
            else:
                reader = _decompressor.stream_reader(content, read_across_frames=True)
                # in chunks, stopping past the claimed size: a forged frame cannot exhaust memory
                while size <= blob.size and (chunk := reader.read(_READ_CHUNK)):
                    digest.update(chunk)
                    size += len(chunk)
        except zstandard.ZstdError as exc:
            return f"the zstd content does not decompress: {exc}"
    if size > blob.size:
        return f"size says {blob.size}, the content is longer (the size was edited)"
    if size != blob.size:
        return f"size says {blob.size}, the content is {size} bytes (the size or the body was edited)"
    if digest.hexdigest() != blob.hash:
        return "the content does not hash to the blob's name (the body was edited)"
    return None
