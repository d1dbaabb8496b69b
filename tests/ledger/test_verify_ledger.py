"""`verify_ledger` covers what `verify_chain` did not: every blob row, every `recorded_at`, and
checkpoints (triggers dropped where an attack needs it, on both backends)."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
import zstandard
from sqlalchemy import text, update

from tests.ledger.helpers import call_events
from tests.ledger.test_tamper import DROP_TRIGGERS
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, PreparedBlob, blob_hash, redact_blob
from usage_ledger.ledger.checkpoint import generate_key, sign_checkpoint
from usage_ledger.ledger.chunk_gaps import encode_chunk_gaps
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import BlobRedacted, CallFailed, CallFinished, new_event, utc_now
from usage_ledger.ledger.schema import blobs, events
from usage_ledger.ledger.verify import verify_chain, verify_chain_on
from usage_ledger.ledger.verify_blobs import BlobReferences, BlobReport, audit_blobs
from usage_ledger.ledger.verify_ledger import LedgerReport, chain_head, snapshot, verify_ledger

DROP_BLOB_TRIGGERS = {
    "sqlite": ["DROP TRIGGER ledger_blobs_no_delete", "DROP TRIGGER ledger_blobs_redaction_only"],
    "postgresql": [
        "DROP TRIGGER ledger_blobs_no_delete ON ledger_blobs",
        "DROP TRIGGER ledger_blobs_redaction_only ON ledger_blobs",
    ],
}
BIG = b'{"messages":[{"role":"user","content":"' + b"tell me about ticker 005930 " * 40 + b'"}]}'
SMALL = b'{"model":"m"}'


async def _seed(database: Database) -> tuple[str, str]:
    """Calls 0..3; call 1 has a compressed body, call 2 a raw one. Returns (zstd hash, raw hash)."""
    compressor = BlobCompressor()
    zstd_blob, raw_blob = compressor.prepare(BIG), compressor.prepare(SMALL)
    assert zstd_blob is not None and zstd_blob.codec == "zstd" and raw_blob is not None and raw_blob.codec == "raw"
    await append_events(database, call_events(0))
    await append_events(database, call_events(1, body_hash=zstd_blob.hash), [zstd_blob])
    await append_events(database, call_events(2, body_hash=raw_blob.hash), [raw_blob])
    await append_events(database, call_events(3, body_hash=zstd_blob.hash))  # the same body again: stored once
    return zstd_blob.hash, raw_blob.hash


async def _sql(database: Database, statement: str, **params: object) -> None:
    async with database.engine.begin() as conn:
        for drop in DROP_BLOB_TRIGGERS[database.backend] + DROP_TRIGGERS[database.backend]:
            await conn.exec_driver_sql(drop.replace("DROP TRIGGER ", "DROP TRIGGER IF EXISTS "))
        await conn.execute(text(statement), params)


async def _problems(database: Database) -> list[str]:
    report = await verify_ledger(database)
    assert not report.ok and report.chain_ok and report.blobs is not None
    return [p.problem for p in report.blobs.problems]


async def test_an_intact_ledger_with_bodies_and_a_redaction_verifies(database: Database) -> None:
    _, raw_hash = await _seed(database)
    await append_events(database, [new_event(BlobRedacted(blob_hash=raw_hash, reason="pii"), stream="blob-x")])
    async with database.engine.begin() as conn:
        assert await redact_blob(conn, raw_hash)
    report = await verify_ledger(database)
    assert report.ok, report
    assert report.blobs is not None and report.blobs.checked == 2 and report.blobs.referenced == 2


@pytest.mark.parametrize("which", ["zstd", "raw"])
async def test_an_edited_body_is_caught(database: Database, which: str) -> None:
    zstd_hash, raw_hash = await _seed(database)
    if which == "zstd":  # a well-formed forgery: same length, valid frame, one digit changed
        forged, digest = zstandard.ZstdCompressor(level=3).compress(BIG.replace(b"005930", b"005931", 1)), zstd_hash
    else:
        forged, digest = SMALL.replace(b'"m"', b'"n"'), raw_hash
    await _sql(
        database,
        "UPDATE ledger_blobs SET content = :c, stored_size = :n WHERE hash = :h",
        c=forged,
        n=len(forged),
        h=digest,
    )
    assert await _problems(database) == ["the content does not hash to the blob's name (the body was edited)"]


async def test_a_deleted_blob_is_caught_with_the_first_event_that_references_it(database: Database) -> None:
    zstd_hash, _ = await _seed(database)
    await _sql(database, "DELETE FROM ledger_blobs WHERE hash = :h", h=zstd_hash)
    report = await verify_ledger(database)
    assert report.blobs is not None and not report.ok
    [problem] = report.blobs.problems
    assert problem.hash == zstd_hash and problem.position == 3 and "not stored" in problem.problem


async def test_a_body_blanked_without_its_event_is_caught_even_with_the_triggers_on(database: Database) -> None:
    _, raw_hash = await _seed(database)
    async with database.engine.begin() as conn:  # what the triggers allow: the redaction-shaped update
        assert await redact_blob(conn, raw_hash)
    assert await _problems(database) == ["the content was erased without a verified blob.redacted event"]


async def test_a_blanking_dated_before_its_redaction_event_is_caught(database: Database) -> None:
    _, raw_hash = await _seed(database)
    await append_events(database, [new_event(BlobRedacted(blob_hash=raw_hash, reason="pii"), stream="blob-x")])
    async with database.engine.begin() as conn:
        await conn.execute(
            update(blobs)
            .where(blobs.c.hash == raw_hash)
            .values(content=None, stored_size=0, redacted_at=utc_now() - timedelta(hours=1))
        )
    assert "before its blob.redacted event" in (await _problems(database))[0]


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("UPDATE ledger_blobs SET size = size + 1 WHERE codec = 'zstd'", "size says"),
        ("UPDATE ledger_blobs SET size = size - 1 WHERE codec = 'raw'", "size says"),
        ("UPDATE ledger_blobs SET stored_size = stored_size + 1 WHERE codec = 'raw'", "stored_size says"),
        ("UPDATE ledger_blobs SET codec = 'lz4' WHERE codec = 'raw'", "unknown codec"),
        ("UPDATE ledger_blobs SET content = :junk WHERE codec = 'zstd'", "does not decompress"),
    ],
)
async def test_an_edited_blob_column_is_caught(database: Database, statement: str, expected: str) -> None:
    await _seed(database)
    params = {"junk": b"not a zstd frame at all, 44 bytes of it....."} if ":junk" in statement else {}
    if params:
        statement = statement.replace("content = :junk", "content = :junk, stored_size = 44")
    await _sql(database, statement, **params)
    assert expected in (await _problems(database))[0]


async def test_an_unreferenced_blob_is_counted_not_a_problem(database: Database) -> None:
    await _seed(database)
    stray = BlobCompressor().prepare(b"nobody asked for this body")
    assert stray is not None
    await append_events(database, [], [stray])
    report = await verify_ledger(database)
    assert report.ok and report.blobs is not None
    assert (report.blobs.unreferenced, report.blobs.problems_total) == (1, 0)


async def test_a_redaction_recorded_for_a_body_never_stored_is_fine(database: Database) -> None:
    lost = blob_hash(b"a body that never reached the ledger")
    await append_events(database, call_events(0, body_hash=lost))
    assert not (await verify_ledger(database)).ok  # referenced, not stored ...
    await append_events(database, [new_event(BlobRedacted(blob_hash=lost, reason="lost"), stream="blob-x")])
    assert (await verify_ledger(database)).ok  # ... until `ledger redact --force` recorded why


async def test_a_gap_blob_is_referenced_and_a_deleted_one_is_caught(database: Database) -> None:
    """`chunk_gaps_blob` is a reference like the bodies: not reported as unreferenced, missed when deleted."""
    gaps = BlobCompressor().prepare(encode_chunk_gaps([15_000 + k % 7 for k in range(500)]))
    assert gaps is not None
    started, finished = call_events(0)
    assert isinstance(finished.body, CallFinished | CallFailed)
    finished = msgspec.structs.replace(finished, body=msgspec.structs.replace(finished.body, chunk_gaps_blob=gaps.hash))
    await append_events(database, [started, finished], [gaps])
    report = await verify_ledger(database)
    assert report.ok, report
    assert report.blobs is not None and report.blobs.checked == 1 and report.blobs.referenced == 1
    await _sql(database, "DELETE FROM ledger_blobs WHERE hash = :h", h=gaps.hash)
    report = await verify_ledger(database)
    assert report.blobs is not None and not report.ok
    [problem] = report.blobs.problems
    assert problem.hash == gaps.hash and problem.position == 2 and "not stored" in problem.problem


async def test_blobs_are_merged_page_by_page(database: Database) -> None:
    """Many blobs through pages of 3, some inline, the rest fetched a few at a time: the merge must see
    every row exactly once, and a body edited on either path is caught."""
    prepared: list[PreparedBlob] = []
    for index in range(25):
        body = f"body {index} ".encode() * (index * 9 + 1)
        blob = BlobCompressor().prepare(body)
        assert blob is not None
        prepared.append(blob)
        await append_events(database, call_events(index, body_hash=blob.hash), [blob])
    stray = BlobCompressor().prepare(b"stray " * 30)
    assert stray is not None
    await append_events(database, [], [stray])
    references = BlobReferences()
    try:
        report = await _audit_all(database, references, page_size=3, fetch_bytes=50, inline_bytes=16)
    finally:
        references.close()
    assert report.checked == 26 and report.referenced == 25
    assert report.problems == [] and report.unreferenced == 1  # the stray
    inline, fetched = min(prepared, key=lambda b: len(b.content)), max(prepared, key=lambda b: len(b.content))
    assert len(inline.content) <= 16 < len(fetched.content) and fetched.codec == "zstd"
    for blob in (inline, fetched):
        body = zstandard.ZstdDecompressor().decompress(blob.content) if blob.codec == "zstd" else blob.content
        body = body.replace(b"body", b"bodY", 1)
        forged = zstandard.ZstdCompressor().compress(body) if blob.codec == "zstd" else body
        await _sql(
            database,
            "UPDATE ledger_blobs SET content = :c, stored_size = :n WHERE hash = :h",
            c=forged,
            n=len(forged),
            h=blob.hash,
        )
    references = BlobReferences()
    try:
        report = await _audit_all(database, references, page_size=3, fetch_bytes=50, inline_bytes=16)
    finally:
        references.close()
    assert sorted(p.hash for p in report.problems) == sorted([inline.hash, fetched.hash])


async def _audit_all(database: Database, references: BlobReferences, **sizes: int) -> BlobReport:
    conn = await snapshot(database)
    try:
        assert (await verify_chain_on(conn, observers=(references,))).ok
        return await audit_blobs(conn, references, timedelta(seconds=120), **sizes)
    finally:
        await conn.close()


async def _set_recorded_at(database: Database, position: int, delta: timedelta) -> None:
    async with database.engine.begin() as conn:
        for drop in DROP_TRIGGERS[database.backend]:
            await conn.exec_driver_sql(drop)
        row = (await conn.execute(events.select().where(events.c.position == position))).one()
        await conn.execute(
            update(events).where(events.c.position == position).values(recorded_at=row.recorded_at + delta)
        )


@pytest.mark.parametrize(
    ("position", "delta", "expected"),
    [
        (3, timedelta(hours=-1), "is before position"),
        (8, timedelta(days=2), "in the future"),
        (
            1,
            timedelta(days=-3650),
            "before the event occurred",
        ),  # recorded_at is now, the event of 2026-11-30: -5 days stopped sufficing on 2026-12-05
    ],
)
async def test_an_implausible_recorded_at_is_caught(
    database: Database, position: int, delta: timedelta, expected: str
) -> None:
    await _seed(database)
    assert (await verify_chain(database)).ok
    await _set_recorded_at(database, position, delta)
    report = await verify_chain(database)
    assert not report.ok and report.first_bad_position == position and expected in (report.problem or ""), report


async def test_recorded_at_within_the_skew_is_the_checkpoints_job(database: Database) -> None:
    await _seed(database)
    key = generate_key("k")
    conn = await snapshot(database)
    try:
        _, checkpoint = await chain_head(conn, None)
    finally:
        await conn.close()
    assert checkpoint is not None
    note = [("cp", sign_checkpoint(checkpoint, key).encode())]
    await _set_recorded_at(database, 5, timedelta(seconds=-1))
    report: LedgerReport = await verify_ledger(database, checkpoints=note, verifier=key.verifier)
    assert report.chain_ok and not report.ok
    assert "recorded_at at or before position 8" in (report.checkpoints[0].problem or "")


async def test_an_append_that_fails_after_its_bodies_leaves_a_ledger_that_verifies(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose events never commit (the gateway killed, or the database gone while the spool's disk is
    full, between the bodies and the events) must not leave a body that `ledger verify` calls tampering."""
    await _seed(database)
    body = BlobCompressor().prepare(b"a response whose call.finished never committed")
    assert body is not None

    def gone(*args: object, **kwargs: object) -> None:
        raise ConnectionResetError("the database went away between the bodies and the events")

    monkeypatch.setattr("usage_ledger.ledger.sqlite_append.build_rows", gone)
    monkeypatch.setattr("usage_ledger.ledger.pg_append.build_rows", gone)
    with pytest.raises(Exception, match="went away"):
        await append_events(database, call_events(4, body_hash=body.hash), [body])
    monkeypatch.undo()
    report = await verify_ledger(database)
    assert report.ok, report.blobs
    assert report.blobs is not None
    # PostgreSQL commits a batch's bodies before its events (docs/scaling.md): the body stays, counted
    assert report.blobs.unreferenced == (1 if database.backend == "postgresql" else 0)
