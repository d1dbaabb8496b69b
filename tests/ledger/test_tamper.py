"""Immutability: triggers refuse changes; with the triggers dropped, `verify_chain` finds tampering."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.exc import DBAPIError

from tests.ledger.helpers import call_events
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, blob_hash, redact_blob
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.verify import verify_chain

DROP_TRIGGERS = {
    "sqlite": [
        "DROP TRIGGER ledger_events_no_update",
        "DROP TRIGGER ledger_events_no_delete",
    ],
    "postgresql": ["DROP TRIGGER ledger_events_no_update_delete ON ledger_events"],
}


async def _seed(database: Database, calls: int = 5) -> None:
    for index in range(calls):
        await append_events(database, call_events(index))


async def _execute(database: Database, *statements: str) -> None:
    async with database.engine.begin() as conn:
        for statement in statements:
            await conn.exec_driver_sql(statement)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_events SET payload = '{}' WHERE position = 2",
        "DELETE FROM ledger_events WHERE position = 2",
        "DELETE FROM ledger_blobs",
        "UPDATE ledger_blobs SET size = 1",
    ],
)
async def test_triggers_refuse_changes(database: Database, statement: str) -> None:
    await _seed(database)
    body = b"x" * 1000
    prepared = BlobCompressor().prepare(body)
    assert prepared is not None
    await append_events(database, call_events(99, body_hash=blob_hash(body)), [prepared])
    with pytest.raises(DBAPIError, match=r"refused|only redaction"):
        await _execute(database, statement)
    assert (await verify_chain(database)).ok


async def test_redaction_is_the_one_allowed_blob_change(database: Database) -> None:
    body = b"secret prompt " * 100
    prepared = BlobCompressor().prepare(body)
    assert prepared is not None
    await append_events(database, call_events(1, body_hash=prepared.hash), [prepared])
    async with database.engine.begin() as conn:
        assert await redact_blob(conn, prepared.hash)
    async with database.engine.begin() as conn:
        assert not await redact_blob(conn, prepared.hash)  # already redacted: nothing changes
    with pytest.raises(DBAPIError):  # content cannot come back
        await _execute(database, "UPDATE ledger_blobs SET content = X'00', redacted_at = NULL")
    assert (await verify_chain(database)).ok


async def _drop_triggers(database: Database) -> None:
    await _execute(database, *DROP_TRIGGERS[database.backend])


async def test_verify_catches_an_edited_payload(database: Database) -> None:
    await _seed(database)
    await _drop_triggers(database)
    await _execute(
        database,
        "UPDATE ledger_events SET payload = replace(payload, '\"prompt_tokens\":100', '\"prompt_tokens\":10') WHERE position = 4",
    )
    report = await verify_chain(database)
    assert not report.ok and report.first_bad_position == 4 and "hash mismatch" in (report.problem or "")


async def test_verify_catches_an_edited_column_outside_the_payload(database: Database) -> None:
    await _seed(database)
    await _drop_triggers(database)
    await _execute(database, "UPDATE ledger_events SET stream = 'call-forged' WHERE position = 3")
    assert (await verify_chain(database)).first_bad_position == 3


async def test_verify_catches_a_deleted_row(database: Database) -> None:
    await _seed(database)
    await _drop_triggers(database)
    await _execute(database, "DELETE FROM ledger_events WHERE position = 6")
    report = await verify_chain(database)
    assert not report.ok and report.first_bad_position == 6 and "deleted" in (report.problem or "")


async def test_verify_catches_two_swapped_rows(database: Database) -> None:
    await _seed(database)
    await _drop_triggers(database)
    await _execute(
        database,
        "UPDATE ledger_events SET position = -1 WHERE position = 3",
        "UPDATE ledger_events SET position = 3 WHERE position = 7",
        "UPDATE ledger_events SET position = 7 WHERE position = -1",
    )
    assert (await verify_chain(database)).first_bad_position == 3


async def test_verify_catches_an_inserted_row(database: Database) -> None:
    await _seed(database)
    await _drop_triggers(database)
    # shift the tail up by one and slip a copy of row 2 in at position 5, hash and all
    for position in range(10, 4, -1):
        await _execute(database, f"UPDATE ledger_events SET position = {position + 1} WHERE position = {position}")
    forged_id = uuid.uuid4().hex if database.backend == "sqlite" else str(uuid.uuid4())
    await _execute(
        database,
        "INSERT INTO ledger_events (position, event_id, type, stream, occurred_at, recorded_at, payload, hash) "
        f"SELECT 5, '{forged_id}', type, stream, occurred_at, recorded_at, payload, hash FROM ledger_events WHERE position = 2",
    )
    assert (await verify_chain(database)).first_bad_position == 5


async def test_verify_with_an_anchor_catches_a_cut_tail(database: Database) -> None:
    await _seed(database)
    intact = await verify_chain(database)
    anchor = (intact.head_position, intact.head_hash)
    assert (await verify_chain(database, expect_head=anchor)).ok
    await _drop_triggers(database)
    # the tail cut and the head row moved back onto the new last row: a shorter chain is still a chain ...
    await _execute(
        database,
        "DELETE FROM ledger_events WHERE position = 10",
        "UPDATE ledger_head SET position = 9, hash = (SELECT hash FROM ledger_events WHERE position = 9)",
    )
    assert (await verify_chain(database)).ok
    assert not (await verify_chain(database, expect_head=anchor)).ok  # ... the anchor tells
